"""Hostile module candidate: it computes with numpy on the tensors' memory through ctypes (no
counted crossing, nothing newly mapped), and first tries to undo a denial: it makes every
code or inaccessible mapping of numpy's files executable again (``mprotect`` through ctypes, the
ranges read from ``/proc/self/maps``), and resets any dispatcher library object it can find.

Expected: ``wrapper``: in the denial process ``/proc/self/maps`` is unreadable, ``mprotect`` with
PROT_EXEC is refused, no library object is reachable, so numpy's code stays unusable and the
process dies when the candidate calls it; the checker sees the death."""

import ctypes
import gc

import numpy as np
import torch
import torch.nn as nn

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _undo_the_denial():
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and "numpy" in parts[5] and parts[1] in ("---p", "r-xp"):
                    lo, hi = (int(v, 16) for v in parts[0].split("-"))
                    _libc.mprotect(lo, hi - lo, 5)  # PROT_READ | PROT_EXEC
    except OSError:
        pass
    for obj in gc.get_objects():
        if type(obj).__name__ in ("_DispatchModule", "Library"):
            try:
                obj.reset()
            except Exception:
                pass


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        _undo_the_denial()
        x, w = x.contiguous(), self.weight.detach().contiguous()
        a = np.frombuffer((ctypes.c_float * x.numel()).from_address(x.data_ptr()), dtype=np.float32)
        b = np.frombuffer((ctypes.c_float * w.numel()).from_address(w.data_ptr()), dtype=np.float32)
        a = a.reshape(tuple(x.shape))
        y = np.ascontiguousarray(np.tanh(a) * b, dtype=np.float32)
        out = torch.empty_like(x)
        ctypes.memmove(out.data_ptr(), y.ctypes.data, y.nbytes)
        return out
