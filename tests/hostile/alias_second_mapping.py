"""Hostile module candidate for a module whose output equals its input (a copy): instead of
copying, it maps the shared arena a second time and returns a tensor over the input's bytes in
that second mapping. Its pointer does not overlap the input's, so a check by addresses inside the
candidate process sees no aliasing; the values are right.

Expected: ``rejected`` for sharing the input's memory, decided by the checker from the arena: it
inverts the input bytes after the call, has the outputs copied out again, and output 0 changed."""

import ctypes
import gc
import mmap

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        arena = next(o for o in gc.get_objects() if type(o).__name__ in ("MappedArena", "SharedArena"))
        second = mmap.mmap(arena.fd, arena.size, mmap.MAP_SHARED, mmap.PROT_READ)
        offset = x.untyped_storage().data_ptr() - ctypes.addressof(ctypes.c_char.from_buffer(arena._map))
        self.keep = second
        return torch.frombuffer(second, dtype=x.dtype, count=x.numel(), offset=offset).view(x.shape)
