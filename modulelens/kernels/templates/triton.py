"""Triton (Python) pieces of the templates: the prelude, signatures, literals and input checks."""

from __future__ import annotations

import math
from typing import Any

from modulelens.kernels.shape_rules import ShapeRule
from modulelens.kernels.templates.call import Call, TArg
from modulelens.kernels.templates.cpp import checked_shape, source_header

TRITON_PRELUDE = """\
import torch
import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    ax = tl.abs(x)
    z = x * x
    small = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
             - 3.33332819422e-1) * z * x + x
    e = tl.exp(2.0 * tl.minimum(ax, 9.0))
    big = 1.0 - 2.0 / (e + 1.0)
    big = tl.where(x < 0, -big, big)
    return tl.where(ax < 0.625, small, big)


def _check(t, name, shape, stride, dtype):
    # -1 in shape: a dimension the shape rule lets vary (any size; the tensor must be contiguous)
    fits = t.dim() == len(shape) and all(s < 0 or a == s for s, a in zip(shape, t.shape))
    if not fits or t.dtype != dtype:
        raise ValueError(f"{name}: this kernel is specialised for shape {list(shape)} (-1: any size) and {dtype}, "
                         f"got {list(t.shape)} and {t.dtype}")
    if -1 in shape:
        if not t.is_contiguous():
            raise ValueError(f"{name}: this kernel takes a contiguous tensor, got strides {list(t.stride())}")
    elif any(s != 1 and a != b for s, a, b in zip(shape, t.stride(), stride)):
        raise ValueError(f"{name}: this kernel is specialised for strides {list(stride)}, got {list(t.stride())}")
"""

TORCH_DTYPE = {"float32": "torch.float32", "float16": "torch.float16", "bfloat16": "torch.bfloat16", "float64": "torch.float64"}


def py_return(values: str, contiguous: bool, shape: list[int], stride: list[int], dtype: str) -> str:
    """The ``return`` line of a triton ``forward`` whose first value ``out`` was computed dense:
    copied into the eager output's layout (``shape``/``stride``) when that is not dense."""
    if contiguous:
        return f"    return {values}\n"
    rest = values.partition(",")[2]
    return (f"    return torch.empty_strided({shape}, {stride}, dtype={TORCH_DTYPE[dtype]}, device=x.device)"
            f".copy_(out){',' + rest if rest else ''}\n")


def py_empty(t: TArg, device_of: str) -> str:
    return f"torch.empty_strided({list(t.shape)}, {list(t.stride)}, dtype={TORCH_DTYPE[t.dtype]}, device={device_of}.device)"


def py_signature(call: Call) -> str:
    return f"def forward({', '.join(call.names)}):"


def py_literal(x: float | int) -> str:
    x = float(x)
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    return repr(x)


def py_checks(call: Call, indent: str = "    ", rule: ShapeRule | None = None) -> str:
    lines = []
    for i, (n, v) in enumerate(zip(call.names, call.values)):
        if isinstance(v, TArg):
            shape = checked_shape(call, i, rule)
            lines.append(f'{indent}_check({n}, "{n}", {shape}, {list(v.stride)}, {TORCH_DTYPE[v.dtype]})')
    return "\n".join(lines)


def py_header(call: Call, family: str, variant: int, vparams: dict[str, Any], rule: ShapeRule | None = None) -> str:
    return source_header(call, family, variant, vparams, "#", rule)
