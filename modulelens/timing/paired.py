"""Paired timing: two callables timed back to back, pair after pair.

On a shared machine the load drifts over seconds; medians taken in separate rounds then compare
different conditions. Here each pair times ``a`` and ``b`` one call each, right after each other
(which one goes first alternates), and the speedup is the median of the pairs' ratios.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from modulelens.timing.samples import Timing, percentile

_perf_counter = time.perf_counter  # taken at import, before any candidate code runs


def paired_timing(a: Callable[[], Any], b: Callable[[], Any], device: str = "cpu", *, min_run_time: float = 0.6,
                  warmup: int = 3, max_pairs: int = 2000, setup: Callable[[], Any] | None = None
                  ) -> tuple[Timing, Timing, float, int]:
    """(timing of a, timing of b, median of a/b over the pairs, pairs). At least 20 pairs.
    ``setup``, when given, runs before every call of either side, untimed."""
    cuda = device.startswith("cuda")

    def once(fn: Callable[[], Any]) -> float:
        if setup is not None:
            setup()
        if cuda:
            torch.cuda.synchronize()
        t0 = _perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return _perf_counter() - t0

    for _ in range(warmup):
        once(a), once(b)
    a_s: list[float] = []
    b_s: list[float] = []
    spent = 0.0
    while (spent < min_run_time or len(a_s) < 20) and len(a_s) < max_pairs:
        if len(a_s) % 2:
            tb, ta = once(b), once(a)
        else:
            ta, tb = once(a), once(b)
        a_s.append(ta)
        b_s.append(tb)
        spent += ta + tb
    threads = torch.get_num_threads()
    timer = "time.perf_counter around single calls, the two sides alternating in back-to-back pairs"

    def summary(xs: list[float]) -> Timing:
        return Timing(median_s=statistics.median(xs), p20_s=percentile(xs, 0.2), p80_s=percentile(xs, 0.8),
                      runs=len(xs), samples=len(xs), warmup=warmup, timer=timer, device=device, threads=threads,
                      cache="warm (CPU caches are not flushed between calls)")

    ratio = statistics.median(x / y for x, y in zip(a_s, b_s) if y > 0)
    return summary(a_s), summary(b_s), ratio, len(a_s)
