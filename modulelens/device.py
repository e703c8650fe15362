"""Where things run: a device named by a string (``cpu``, ``cuda``, ``cuda:1``), parsed and
checked once, and what the code does with it (synchronise, time with CUDA events, ask a tensor or
module where it lives).

Devices arrive as strings: from a tool's ``device`` argument, or from what a capture or card
recorded (``environment.device``, ``card.device``) when the argument is left out. They cross
process boundaries (sandbox tasks, Ray tasks) as strings too, so each side checks the string it is
given with :func:`require` where it runs.

**The policy for "CUDA asked for, none here"** is one error, everywhere (:class:`DeviceUnavailable`,
written by :func:`unavailable`): whatever asked for ``cuda`` (an argument or the device a capture
recorded), a machine where torch sees no CUDA device (or fewer than the index asked for) refuses
with the same one-line message naming the device, and the fix: ``--device cpu`` or a machine with
a GPU. Nothing falls back to the CPU on its own: a user who asked for CUDA never gets a CPU figure
labelled as theirs. Code that only *describes* a device it will not run on (a roofline ceiling for
an opset recorded elsewhere) asks :func:`runs_here` and gives no figure.

A leaf: imports nothing of modulelens but :mod:`modulelens.errors`.
"""

from __future__ import annotations

from typing import Any

import torch

from modulelens.errors import ModuleLensError

__all__ = ["CudaEvents", "DeviceUnavailable", "device_of", "is_cuda", "parse", "processor_name", "require",
           "runs_here", "same_device", "synchronize", "unavailable"]


class DeviceUnavailable(ModuleLensError):
    """A device asked for that this machine does not have (see the module docstring): a refusal,
    never a verdict on what was to run there."""


def parse(device: str | torch.device) -> torch.device:
    """``device`` as a :class:`torch.device`; a :class:`ModuleLensError` naming it when torch cannot
    read it (``gpu``, ``cuda:x``, ``""``)."""
    if isinstance(device, torch.device):
        return device
    try:
        return torch.device(device.strip())
    except (RuntimeError, ValueError, TypeError, AttributeError):
        raise ModuleLensError(f"device {device!r} is not a device torch knows",
                              "give [--device cpu], [--device cuda] or [--device cuda:N]") from None


def is_cuda(device: str | torch.device) -> bool:
    """``device`` names a CUDA device (``cuda``, ``cuda:1``); False for anything else, a malformed
    string included (:func:`parse` says why)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return device.strip().split(":", 1)[0] == "cuda"


def same_device(a: str | torch.device, b: str | torch.device) -> bool:
    """``a`` and ``b`` name one device (``cuda`` is ``cuda:0``, what torch picks first)."""
    x, y = parse(a), parse(b)
    return x.type == y.type and (x.index or 0) == (y.index or 0)


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def runs_here(device: str | torch.device) -> bool:
    """Work on ``device`` can run on this machine: not CUDA, or a CUDA device torch sees."""
    dev = parse(device)
    if dev.type != "cuda":
        return True
    count = _cuda_count()
    return count > 0 and (dev.index is None or dev.index < count)


def unavailable(device: str | torch.device, *, can_choose: bool = True) -> DeviceUnavailable:
    """The one error for a CUDA device asked for on a machine that lacks it (module docstring).
    ``can_choose``: the caller takes a device argument, so the hint offers ``--device cpu``."""
    count = _cuda_count()
    seen = "no CUDA device" if count == 0 else f"only {count} CUDA device(s)"
    hint = ("pass [--device cpu] to run on the CPU, or run on a machine with a GPU" if can_choose
            else "run on a machine with a GPU")
    return DeviceUnavailable(f"device {str(device)!r} was asked for, but torch sees {seen} on this machine", hint)


def require(device: str | torch.device, *, can_choose: bool = True) -> str:
    """``device`` checked (:func:`parse`) and present on this machine, as the string to hand on;
    :class:`DeviceUnavailable` otherwise (see :func:`unavailable` for ``can_choose``)."""
    dev = parse(device)
    if not runs_here(dev):
        raise unavailable(device, can_choose=can_choose)
    return str(device).strip() if isinstance(device, str) else str(dev)


def processor_name(device: str | torch.device) -> str:
    """The model of the processor that computes on ``device`` here (a CPU's ``model name`` from
    ``/proc/cpuinfo``, a GPU's name), or "" where it cannot be told. Kernels of BLAS and vectorised
    libraries pick code paths per processor, so two processors may round the same call differently."""
    if is_cuda(device):
        return torch.cuda.get_device_name(parse(device)) if runs_here(device) else ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor()


def synchronize(device: str | torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA); nothing to wait for elsewhere."""
    if is_cuda(device):
        torch.cuda.synchronize(parse(device))


def device_of(value: torch.Tensor | torch.nn.Module) -> torch.device:
    """Where a tensor lives, or a module's first parameter or buffer (CPU for a module without any)."""
    if isinstance(value, torch.Tensor):
        return value.device
    for t in value.parameters():
        return t.device
    for t in value.buffers():
        return t.device
    return torch.device("cpu")


class CudaEvents:
    """Timing hooks on one CUDA device: events recorded on the current stream, synchronisation,
    and a buffer to flush the L2 cache with. ``cuda`` is ``torch.cuda`` unless a test injects a
    stand-in (so the path can be exercised without a GPU)."""

    def __init__(self, device: str | torch.device, cuda: Any = None):
        self.cuda = cuda if cuda is not None else torch.cuda
        self.device = device
        self._flush_buffer: Any = None

    def event(self) -> Any:
        return self.cuda.Event(enable_timing=True)

    def stream(self) -> Any:
        return self.cuda.current_stream(self.device)

    def synchronize(self) -> None:
        self.cuda.synchronize(self.device)

    def flush_l2(self) -> None:
        """Overwrite a buffer twice the L2 cache (64 MiB at least), so the next call starts from memory."""
        if self._flush_buffer is None:
            props = self.cuda.get_device_properties(self.device)
            size = max(2 * int(getattr(props, "L2_cache_size", 0) or 0), 64 << 20)
            self._flush_buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        self._flush_buffer.zero_()

    def seconds(self, fn: Any, calls: int = 1) -> float:
        """Seconds of ``calls`` calls of ``fn`` by events on the current stream, the device
        synchronised before (earlier work not counted) and after."""
        self.synchronize()
        stream = self.stream()
        start, end = self.event(), self.event()
        start.record(stream)
        for _ in range(calls):
            fn()
        end.record(stream)
        self.synchronize()
        return start.elapsed_time(end) / 1e3
