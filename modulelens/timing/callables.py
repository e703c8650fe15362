"""A :class:`~modulelens.timing.interleaved.Side` made of a callable in this process.

CPU: ``time.perf_counter`` around ``calls`` calls. CUDA: CUDA events recorded on the current
stream around the calls, the device synchronised before (so earlier work is not counted) and
after, and the L2 cache flushed before every batch (a buffer twice its size overwritten), so that
every batch starts from memory the way a training step does. With a ``setup`` (calls that change
their inputs), it runs before every call outside the clock and the calls are timed one by one. The CUDA layer is injected
(:class:`modulelens.device.CudaEvents`, default ``torch.cuda``) so the path can be exercised without a GPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from modulelens.device import CudaEvents, is_cuda

_perf_counter = time.perf_counter


def cuda_batch_seconds(fn: Callable[[], Any], calls: int, layer: CudaEvents) -> float:
    """Seconds of ``calls`` calls of ``fn`` by CUDA events on the current stream (L2 flushed and
    the device synchronised first)."""
    layer.flush_l2()
    return layer.seconds(fn, calls)


def with_setup_seconds(fn: Callable[[], Any], calls: int, setup: Callable[[], Any], layer: CudaEvents | None) -> float:
    """Seconds of ``calls`` calls of ``fn``, each after ``setup()`` (outside the clock): for calls
    that change what they are given (a key/value cache that grows). Each call is timed alone
    (CUDA events around it, the device synchronised after the setup) and the times are summed."""
    total = 0.0
    for _ in range(calls):
        setup()
        if layer is not None:
            total += layer.seconds(fn)
        else:
            t0 = _perf_counter()
            fn()
            total += _perf_counter() - t0
    return total


class CallableSide:
    """``fn`` called in this process (see the module docstring); with ``setup``, it runs before
    every call, untimed. ``set_threads`` sets this process's torch thread count (shared by every
    in-process side)."""

    def __init__(self, label: str, fn: Callable[[], Any], device: str = "cpu", *, cuda: CudaEvents | None = None,
                 before_batch: Callable[[int], Any] | None = None, setup: Callable[[], Any] | None = None):
        self.label, self.fn, self.device = label, fn, device
        self.cuda = cuda if cuda is not None else (CudaEvents(device) if is_cuda(device) else None)
        self.before_batch = before_batch
        self.setup = setup
        self.timer = ("CUDA events on the current stream, L2 flushed before each batch" if self.cuda is not None
                      else "time.perf_counter around each batch in this process")

    def prepare(self, calls: int, round_index: int) -> None:
        if self.before_batch is not None:
            self.before_batch(round_index)

    def batch(self, calls: int, round_index: int) -> float:
        if self.setup is not None:
            return with_setup_seconds(self.fn, calls, self.setup, self.cuda)
        if self.cuda is not None:
            return cuda_batch_seconds(self.fn, calls, self.cuda)
        fn = self.fn
        t0 = _perf_counter()
        for _ in range(calls):
            fn()
        return _perf_counter() - t0

    def pids(self) -> list[int]:
        return [os.getpid()]

    def hold(self) -> None:
        pass

    def release(self) -> None:
        pass

    def set_threads(self, threads: int) -> None:
        import torch

        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
