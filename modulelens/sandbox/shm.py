"""Tensors passed between the checker and a candidate process through one shared memory file.

The checker owns a :class:`SharedArena` (an anonymous ``memfd``, passed to the candidate process
as an inherited file descriptor) and writes a call's input tensors into it; the candidate process
maps the same file and sees those inputs as tensors *viewing* the shared bytes (same shape,
strides, dtype), so the checker sees afterwards whether an input was modified, and a later call
with new values written into the same buffers hits the same ``data_ptr``. Outputs travel back the
same way: the candidate process copies each output into the arena and names its place with a
:class:`TensorSlot`; the checker reads the bytes and decides. Nothing but bytes and slot
descriptions crosses: no pickles.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, Field

_ALIGN = 64
_DTYPES = {str(d): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128,
)}


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


class SharedArena:
    """A resizable shared memory file, mapped here. ``fd`` is what the other process inherits."""

    def __init__(self, size: int = 1 << 20, fd: int | None = None):
        self.fd = fd if fd is not None else os.memfd_create("modulelens-arena", 0)
        self.size = 0
        self._map: mmap.mmap | None = None
        if fd is None:
            self.resize(size)
        else:
            self.remap(size)

    def resize(self, size: int) -> None:
        """Grow the file to at least ``size`` bytes (owner side) and map it."""
        size = max(aligned(size), 1 << 16)
        if size > self.size:
            os.ftruncate(self.fd, size)
            self.remap(size)

    def remap(self, size: int) -> None:
        """Map the first ``size`` bytes of the file (the side that did not resize it)."""
        if size == self.size and self._map is not None:
            return
        self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.size = size

    def buffer(self) -> mmap.mmap:
        """The mapped bytes (for byte-level access; release any memoryview before a remap)."""
        assert self._map is not None
        return self._map

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

    def put(self, t: torch.Tensor, offset: int) -> TensorSlot:
        """Write ``t`` (any device, its strides kept) at ``offset``; returns its slot."""
        t = t.detach()
        nbytes = span_bytes(t)
        slot = TensorSlot(offset=offset, nbytes=nbytes, dtype=str(t.dtype), shape=list(t.shape),
                          stride=list(t.stride()), device=str(t.device))
        if offset + nbytes > self.size:
            raise ValueError(f"a tensor of {nbytes} bytes does not fit in the arena at {offset}")
        if nbytes:
            self.view(slot).copy_(t.cpu() if t.device.type != "cpu" else t)
        return slot

    def read(self, slot: TensorSlot) -> torch.Tensor:
        """A private copy of the slot's tensor (same strides), on CPU."""
        view = self.view(slot)
        out = torch.empty_strided(view.shape, view.stride(), dtype=view.dtype)
        out.copy_(view)
        return out

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        try:
            os.close(self.fd)
        except OSError:
            pass


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
