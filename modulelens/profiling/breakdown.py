"""``torch.profiler`` breakdown (top operators by self time, with shapes) and peak memory."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, Field


class OpTime(BaseModel):
    op: str
    input_shapes: str
    calls_per_run: float
    self_s_per_run: float = Field(description="Self time per profiled run, seconds.")
    share: float = Field(description="Fraction of all self time.")


def profile_breakdown(fn: Callable[[], Any], device: str, runs: int = 5,
                      top: int | None = None) -> tuple[list[OpTime], int, str]:
    """Operators by self time (the first ``top``, None: all) over ``runs`` calls (after one warm-up) and the peak memory
    allocated during one call: CUDA allocator peak on GPU; on CPU, the largest running total of
    allocations minus frees seen by the profiler. Returns (ops, peak_bytes, how_peak_was_measured)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(runs):
            fn()
        if cuda:
            torch.cuda.synchronize()
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages(group_by_input_shape=True) if getattr(e, attr, 0) > 0]
    total = sum(getattr(e, attr) for e in events) or 1.0
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    ops = [
        OpTime(op=e.key, input_shapes=str(e.input_shapes), calls_per_run=e.count / runs,
               self_s_per_run=getattr(e, attr) / 1e6 / runs, share=getattr(e, attr) / total)
        for e in events[:top]
    ]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return ops, int(torch.cuda.max_memory_allocated() - before), "CUDA allocator peak above the memory in use before the call"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    deltas = sorted(
        (e.time_range.start, e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage)
        for e in prof.events()
    )
    peak = max(itertools.accumulate(d for _, d in deltas), default=0)
    return ops, int(max(peak, 0)), "largest running total of CPU allocations minus frees during one call (torch.profiler)"
