"""``torch.profiler`` breakdown (top operators by self time, with shapes) and peak memory."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch
from pydantic import BaseModel, Field

from modulelens.device import is_cuda


class OpTime(BaseModel):
    op: str
    input_shapes: str
    calls_per_run: float
    self_s_per_run: float = Field(description="Self time per profiled run, seconds.")
    share: float = Field(description="Fraction of all self time.")


# The profiler's own log lines (kineto, written by C++ straight to file descriptor 2):
# "USDT:2026-12-07 12:47:45 8495:8495 SyncActivityProfilerHandler.cpp:52] profiler_start".
_PROFILER_CHATTER = re.compile(r"^(USDT|STAGE|INFO):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def profiler_chatter_held() -> Iterator[None]:
    """Hold what is written to file descriptor 2 while the profiler runs (its log lines come from
    C++, past ``sys.stderr``, and would break a progress line drawn there); afterwards the lines
    that are not the profiler's own chatter (its warnings and errors, anything else) are written to
    ``sys.stderr`` whole, where the progress display puts them on lines of their own. Where fd 2
    cannot be redirected, nothing is held."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
    kept = [line for line in text.splitlines()
            if line.strip() and "\x1b" not in line and not _PROFILER_CHATTER.match(line)]  # \x1b: a display's own redraw
    if kept:
        sys.stderr.write("\n".join(kept) + "\n")
        sys.stderr.flush()


def profile_breakdown(fn: Callable[[], Any], device: str, runs: int = 5,
                      top: int | None = None, setup: Callable[[], Any] | None = None) -> tuple[list[OpTime], int, str]:
    """Operators by self time (the first ``top``, None: all) over ``runs`` calls (after one warm-up) and the peak memory
    allocated during one call: CUDA allocator peak on GPU; on CPU, the largest running total of
    allocations minus frees seen by the profiler. ``setup``, when given, runs before every call,
    outside the profiler (each call is then profiled alone). Returns (ops, peak_bytes,
    how_peak_was_measured)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = is_cuda(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    prepare = setup or (lambda: None)
    prepare()
    fn()
    totals: dict[tuple[str, str], list[float]] = {}  # (op, shapes) -> [calls, self time in us]
    for batch in ([1] * runs if setup is not None else [runs]):
        prepare()
        with profiler_chatter_held(), profile(activities=activities, record_shapes=True) as prof:
            for _ in range(batch):
                fn()
            if cuda:
                torch.cuda.synchronize()
        for e in prof.key_averages(group_by_input_shape=True):
            if getattr(e, attr, 0) > 0:
                entry = totals.setdefault((e.key, str(e.input_shapes)), [0, 0.0])
                entry[0] += e.count
                entry[1] += getattr(e, attr)
    total = sum(t for _, t in totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: kv[1][1], reverse=True)
    ops = [
        OpTime(op=op, input_shapes=shapes, calls_per_run=count / runs, self_s_per_run=t / 1e6 / runs, share=t / total)
        for (op, shapes), (count, t) in ranked[:top]
    ]
    prepare()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return ops, int(torch.cuda.max_memory_allocated() - before), "CUDA allocator peak above the memory in use before the call"
    with profiler_chatter_held(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    deltas = sorted(
        (e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
        for e in prof.events()
    )
    peak = max(itertools.accumulate(d for _, d in deltas), default=0)
    return ops, int(max(peak, 0)), "largest running total of CPU allocations minus frees during one call (torch.profiler)"
