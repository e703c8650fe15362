"""Hostile card candidate (a Python source, run as the triton backend): softmax computed by numpy
on the tensor's memory reached through ctypes, the result written back with memmove. It never
calls ``Tensor.numpy`` or ``torch.from_numpy`` (the counted crossings), and numpy's core is mapped
by torch at import (no new library in the memory map). Judged by those alone, it would be custom.

Expected: ``wrapper``, because where numpy is denied it raises (numpy named)."""

import ctypes

import numpy as np
import torch


def forward(x, dim, half_to_float):
    x = x.contiguous()
    n = x.numel()
    a = np.ctypeslib.as_array((ctypes.c_float * n).from_address(x.data_ptr())).reshape(tuple(x.shape))
    e = np.exp(a - a.max(axis=dim, keepdims=True))
    s = np.ascontiguousarray(e / e.sum(axis=dim, keepdims=True), dtype=np.float32)
    out = torch.empty_like(x)
    ctypes.memmove(out.data_ptr(), s.ctypes.data, s.nbytes)
    return out
