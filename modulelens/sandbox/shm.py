"""Tensors passed between the checker and a candidate process through one shared memory file.

The checker owns a :class:`SharedArena`: a ``memfd`` sealed against shrinking and growing
(``F_SEAL_SHRINK | F_SEAL_GROW``, then ``F_SEAL_SEAL`` so no seal can be removed or added), passed
to the candidate process as a descriptor. The candidate process maps it (:class:`MappedArena`) and
sees a call's inputs as tensors *viewing* the shared bytes (same shape, strides, dtype), so the
checker sees afterwards whether an input was modified, and a later call with new values written
into the same buffers hits the same ``data_ptr``. Outputs travel back the same way: the candidate
process copies each output into the arena and names its place with a :class:`TensorSlot`; the
checker reads the bytes and decides. Nothing but bytes and slot descriptions crosses: no pickles.

The checker never maps the arena: it reads and writes it with ``pread``/``pwrite``, so a candidate
that manages to shrink the file (a kernel without sealing) makes a read come back short -- a
rejection -- instead of a ``SIGBUS`` in the checker. Sealed, the candidate can neither pull memory
away from under the checker nor grow the file to exhaust memory by writing past its end. A bigger
arena is a new sealed memfd (the old content copied): :attr:`SharedArena.generation` tells the
owner of the channel that the candidate must be sent the new descriptor.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, Field

_ALIGN = 64
_DTYPES = {str(d): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128,
)}
_SEALS = ("F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_SEAL")
_CHUNK = 1 << 24


class TensorSlot(BaseModel):
    """Where one tensor's bytes lie in the arena, and how to view them."""

    offset: int = Field(ge=0, description="Byte offset of the tensor's storage in the arena.")
    nbytes: int = Field(ge=0, description="Bytes of storage the view spans.")
    dtype: str = Field(description="torch dtype, as str(dtype): 'torch.float32'.")
    shape: list[int]
    stride: list[int]
    device: str = Field("cpu", description="The device the tensor lives on at its owner's side.")


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype named ``name`` (only plain numeric dtypes travel)."""
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name}")
    return _DTYPES[name]


def span_bytes(t: torch.Tensor) -> int:
    """Bytes from a tensor's first to one past its last element, for its strides."""
    if t.numel() == 0:
        return 0
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def sealing_available() -> bool:
    """Whether this Python and kernel can seal a memfd's size."""
    return all(hasattr(fcntl, name) for name in ("F_ADD_SEALS", *_SEALS)) and hasattr(os, "MFD_ALLOW_SEALING")


def sealed_memfd(size: int, name: str = "modulelens-arena") -> tuple[int, bool]:
    """(fd, sealed): a memfd of exactly ``size`` bytes, sealed against shrinking, growing and
    further sealing where the kernel allows (else unsealed)."""
    if not sealing_available():
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return fd, False
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except OSError:
        return fd, False
    return fd, True


def _buffer(t: torch.Tensor, nbytes: int) -> Any:
    """A writable buffer over the first ``nbytes`` bytes of the CPU tensor ``t``'s storage."""
    return (ctypes.c_char * nbytes).from_address(t.data_ptr())


def _strided(slot: TensorSlot, fill: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """A CPU tensor laid out as ``slot`` says, in a storage of the slot's span, filled by ``fill``
    (which gets the flat storage)."""
    dtype = dtype_of(slot.dtype)
    item = torch.empty((), dtype=dtype).element_size()
    count = slot.nbytes // item
    if count == 0:
        return torch.empty_strided(slot.shape, slot.stride or [1] * len(slot.shape), dtype=dtype)
    flat = torch.zeros(count, dtype=dtype)
    fill(flat)
    return flat.as_strided(slot.shape, slot.stride)


def _placed(t: torch.Tensor, offset: int, size: int) -> tuple[torch.Tensor, TensorSlot]:
    """(``t`` on CPU, its slot at ``offset``) when it fits in ``size`` bytes; else ValueError."""
    t = t.detach()
    slot = TensorSlot(offset=offset, nbytes=span_bytes(t), dtype=str(t.dtype), shape=list(t.shape),
                      stride=list(t.stride()), device=str(t.device))
    if offset + slot.nbytes > size:
        raise ValueError(f"a tensor of {slot.nbytes} bytes does not fit in the arena at {offset}")
    return (t.cpu() if t.device.type != "cpu" else t), slot


def _elements(mapped, size: int, slot: TensorSlot, fmt: str) -> memoryview:
    """The slot's bytes of ``mapped`` (an arena of ``size`` bytes) in place as a memoryview of
    ``fmt`` items (a struct format such as ``I``): element moves without torch or numpy (numpy's
    code is unusable in a denial process)."""
    if slot.offset + slot.nbytes > size:
        raise ValueError("slot outside the arena")
    item = struct.calcsize(fmt)
    return memoryview(mapped)[slot.offset:slot.offset + slot.nbytes // item * item].cast(fmt)


class SharedArena:
    """The checker's side: a sealed shared memory file, read and written by offset, never mapped
    here. ``fd`` is what the candidate process is given; ``generation`` grows whenever
    :meth:`resize` replaced the file (the candidate must be sent the new ``fd``)."""

    def __init__(self, size: int = 1 << 20):
        self.fd = -1
        self.size = 0
        self.generation = 0
        self.sealed = False
        self.resize(size)

    def resize(self, size: int) -> None:
        """Make room for at least ``size`` bytes: a new sealed file holding the old content."""
        size = max(aligned(size), 1 << 16)
        if size <= self.size:
            return
        fd, self.sealed = sealed_memfd(size)
        done = 0
        while done < self.size:
            chunk = os.pread(self.fd, min(_CHUNK, self.size - done), done)
            if not chunk:
                break
            os.pwrite(fd, chunk, done)
            done += len(chunk)
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.size = fd, size
        self.generation += 1

    def elements(self, slot: TensorSlot, fmt: str) -> memoryview:
        """See :func:`_elements`."""
        return _elements(self._map, self.size, slot, fmt)

    def put(self, t: torch.Tensor, offset: int) -> TensorSlot:
        """Write ``t`` (any device, its strides kept) at ``offset``; returns its slot."""
        src, slot = _placed(t, offset, self.size)
        if slot.nbytes:
            laid = _strided(slot, lambda flat: None)
            laid.copy_(src)
            view = memoryview(_buffer(laid, slot.nbytes)).cast("B")
            while view:
                n = os.pwrite(self.fd, view, offset)
                view, offset = view[n:], offset + n
        return slot

    def read(self, slot: TensorSlot) -> torch.Tensor:
        """A private copy of the slot's tensor (same strides), on CPU. Raises ValueError when the
        bytes are not there (a slot outside the arena, or a file shrunk under it)."""
        if slot.offset + slot.nbytes > self.size:
            raise ValueError("slot outside the arena")

        def fill(flat: torch.Tensor) -> None:
            view = memoryview(_buffer(flat, slot.nbytes)).cast("B")
            offset = slot.offset
            while view:
                n = os.preadv(self.fd, [view], offset)
                if n <= 0:
                    raise ValueError("the arena is shorter than the slot (its file was shrunk)")
                view, offset = view[n:], offset + n

        return _strided(slot, fill)

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


class MappedArena:
    """The candidate process's side: the arena file mapped whole (its size is the file's), tensors
    viewing it in place. :meth:`replace` switches to a bigger arena the checker sent."""

    def __init__(self, fd: int):
        self.fd = fd
        self._map: mmap.mmap | None = None
        self.size = 0
        self._map_whole()

    def _map_whole(self) -> None:
        self.size = os.fstat(self.fd).st_size
        self._map = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def replace(self, fd: int) -> None:
        """Map the new arena file ``fd`` instead (views of the old one stay valid until freed)."""
        old = self.fd
        self.fd = fd
        self._map_whole()
        try:
            os.close(old)
        except OSError:
            pass

    def view(self, slot: TensorSlot) -> torch.Tensor:
        """A CPU tensor viewing the slot's bytes in place (writes go to the shared file)."""
        if slot.offset + slot.nbytes > self.size:
            raise ValueError("slot outside the arena")
        dtype = dtype_of(slot.dtype)
        item = torch.empty((), dtype=dtype).element_size()
        count = slot.nbytes // item
        if count == 0:
            return torch.empty_strided(slot.shape, slot.stride or [1] * len(slot.shape), dtype=dtype)
        flat = torch.frombuffer(self._map, dtype=dtype, count=count, offset=slot.offset)
        return flat.as_strided(slot.shape, slot.stride)

    def elements(self, slot: TensorSlot, fmt: str) -> memoryview:
        """See :func:`_elements`."""
        return _elements(self._map, self.size, slot, fmt)

    def put(self, t: torch.Tensor, offset: int) -> TensorSlot:
        """Write ``t`` (any device, its strides kept) at ``offset``; returns its slot."""
        src, slot = _placed(t, offset, self.size)
        if slot.nbytes:
            self.view(slot).copy_(src)
        return slot

    def read(self, slot: TensorSlot) -> torch.Tensor:
        """A private copy of the slot's tensor (same strides), on CPU."""
        view = self.view(slot)
        out = torch.empty_strided(view.shape, view.stride(), dtype=view.dtype)
        out.copy_(view)
        return out


def encode_value(value: Any, put: Callable[[torch.Tensor], TensorSlot]) -> Any:
    """A JSON-able description of an argument: tensors become ``{"t": slot}`` (written with
    ``put``), lists and tuples ``{"l": [...], "tuple": bool}``, dtypes, devices, layouts and memory
    formats ``{"torch": name}``; numbers, strings, bools and None stay as they are."""
    if isinstance(value, torch.Tensor):
        return {"t": put(value).model_dump()}
    if isinstance(value, (list, tuple)):
        return {"l": [encode_value(v, put) for v in value], "tuple": isinstance(value, tuple)}
    if isinstance(value, torch.dtype):
        return {"torch": str(value).removeprefix("torch.")}
    if isinstance(value, (torch.layout, torch.memory_format)):
        return {"torch": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"arguments of type {type(value).__name__} cannot be passed to a candidate")


def decode_value(value: Any, get: Callable[[TensorSlot], torch.Tensor]) -> Any:
    """The inverse of :func:`encode_value` (tensors from ``get``)."""
    if isinstance(value, dict):
        if "t" in value:
            return get(TensorSlot.model_validate(value["t"]))
        if "l" in value:
            items = [decode_value(v, get) for v in value["l"]]
            return tuple(items) if value.get("tuple") else items
        if "torch" in value:
            name = str(value["torch"])
            attr = getattr(torch, name, None)
            if not isinstance(attr, (torch.dtype, torch.layout, torch.memory_format)):
                raise ValueError(f"unknown torch constant {name}")
            return attr
        if "device" in value:
            return torch.device(str(value["device"]))
        raise ValueError("unknown encoded value")
    return value
