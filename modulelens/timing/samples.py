"""Time a callable with an established timer and report the spread.

CPU: ``torch.utils.benchmark.Timer.timeit`` repeated for ``min_run_time`` seconds, each sample
one call (or a few, for calls under 50 us), so the spread is that of individual calls. CUDA: CUDA events around each run, with the
device synchronised and the L2 cache flushed (a large buffer is overwritten) before every run.
With a ``setup`` run before every call (calls that change their inputs), CPU samples are single
calls timed by ``time.perf_counter``, the setup outside the clock. Either way: explicit warm-up
calls first, then median, p20 and p80 over the measured samples.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, Field

from modulelens.device import CudaEvents, is_cuda


class Timing(BaseModel):
    median_s: float = Field(description="Median seconds per call.")
    p20_s: float = Field(description="20th percentile of the per-call samples (seconds).")
    p80_s: float = Field(description="80th percentile of the per-call samples (seconds).")
    runs: int = Field(description="Calls measured (after warm-up).")
    samples: int = Field(description="Timing samples the percentiles are taken over.")
    warmup: int = Field(description="Untimed calls made first.")
    timer: str = Field(description="Which timer produced the samples.")
    device: str
    threads: int = Field(description="torch intra-op threads during timing.")
    cache: str = Field(description="Cache state during timing.")


def percentile(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, linearly interpolated between neighbouring samples."""
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def time_callable(fn: Callable[[], Any], device: str = "cpu", *, min_run_time: float = 0.5, warmup: int = 3,
                  max_samples: int = 200, setup: Callable[[], Any] | None = None) -> Timing:
    """Time ``fn`` (see the module docstring). ``setup``, when given, runs before every call,
    untimed (each sample is then one call): for calls that change what they are given."""
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    threads = torch.get_num_threads()
    if is_cuda(device):
        return _time_cuda(fn, device, min_run_time, warmup, max_samples, threads, setup)
    if setup is not None:
        return _time_with_setup(fn, setup, device, min_run_time, warmup, max_samples, threads)
    from torch.utils.benchmark import Timer

    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    # Calls per sample: enough that one sample lasts >= 50 us (timer overhead negligible), else 1, so
    # that the percentiles describe the spread of individual calls rather than of block averages.
    estimate = timer.timeit(1).times[0]
    number = max(1, int(50e-6 / max(estimate, 1e-9)))
    times: list[float] = []
    spent = 0.0
    while (spent < min_run_time or len(times) < 10) and len(times) < max_samples * 50:
        t = timer.timeit(number).times[0]
        times.append(t)
        spent += t * number
    return Timing(
        median_s=statistics.median(times), p20_s=percentile(times, 0.2), p80_s=percentile(times, 0.8),
        runs=len(times) * number, samples=len(times), warmup=warmup,
        timer=f"torch.utils.benchmark.Timer.timeit, {number} call(s) per sample",
        device=device, threads=threads, cache="warm (CPU caches are not flushed between calls)",
    )


def _time_with_setup(fn, setup, device, min_run_time, warmup, max_samples, threads) -> Timing:
    """One call per sample, ``setup()`` before each, outside the clock."""
    times: list[float] = []
    spent = 0.0
    while (spent < min_run_time or len(times) < 10) and len(times) < max_samples * 50:
        setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        spent += times[-1]
    return Timing(
        median_s=statistics.median(times), p20_s=percentile(times, 0.2), p80_s=percentile(times, 0.8),
        runs=len(times), samples=len(times), warmup=warmup,
        timer="time.perf_counter around single calls, each after an untimed setup", device=device,
        threads=threads, cache="warm (CPU caches are not flushed between calls)",
    )


def _time_cuda(fn, device, min_run_time, warmup, max_samples, threads, setup=None) -> Timing:
    events = CudaEvents(device)
    times: list[float] = []
    total = 0.0
    while (total < min_run_time or len(times) < 10) and len(times) < max_samples:
        if setup is not None:
            setup()
        events.flush_l2()
        t = events.seconds(fn)
        times.append(t)
        total += t
    return Timing(
        median_s=statistics.median(times), p20_s=percentile(times, 0.2), p80_s=percentile(times, 0.8),
        runs=len(times), samples=len(times), warmup=warmup, timer="CUDA events, synchronised, one call per sample",
        device=device, threads=threads, cache="cold L2 (flushed before every call)",
    )
