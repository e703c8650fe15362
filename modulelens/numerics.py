"""Comparing tensors: errors and per-dtype tolerances, in one place.

Comparisons run in bounded memory: tensors are compared in chunks of :data:`CHUNK_ELEMENTS`
elements (each chunk converted to float64 on its own), so multi-GiB tensors never get a whole
float64 copy. Mismatch details are short: shape, dtype, the first index outside the tolerance and
a few values, never a whole tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

# (rtol, atol) like torch.testing's defaults for each dtype.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}

CHUNK_ELEMENTS = 1 << 22
"""Elements compared at once (32 MiB per float64 operand)."""

_SHOWN_VALUES = 4


def tolerances(*dtypes: torch.dtype) -> tuple[float, float]:
    """The loosest tolerance among the dtypes involved (exact for integers and bools)."""
    rtol, atol = 0.0, 0.0
    for dt in dtypes:
        r, a = TOLERANCES.get(dt, (0.0, 0.0) if not dt.is_floating_point else (1e-3, 1e-5))
        rtol, atol = max(rtol, r), max(atol, a)
    return rtol, atol


@dataclass
class TensorDiff:
    shape_ok: bool
    dtype_ok: bool
    max_abs_error: float
    max_rel_error: float
    allclose: bool
    detail: str = ""


def short_repr(value: Any, limit: int = 80) -> str:
    """A repr that never holds a whole tensor: tensors as shape and dtype, others cut at ``limit``."""
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={list(value.shape)}, dtype={str(value.dtype).removeprefix('torch.')})"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu", torch.float64) if not t.is_complex() else t.cpu()


@dataclass
class _Running:
    max_abs: float = 0.0
    max_rel: float = 0.0
    bad: int = 0
    first_bad: int | None = None
    shown: str = ""


def _compare_chunk(a: torch.Tensor, e: torch.Tensor, offset: int, rtol: float, atol: float, run: _Running) -> None:
    both_nan = torch.isnan(a) & torch.isnan(e)
    same_inf = torch.isinf(a) & (a == e)
    err = (a - e).abs().masked_fill(both_nan | same_inf, 0.0)
    err = torch.nan_to_num(err, nan=math.inf)
    if err.numel() == 0:
        return
    run.max_abs = max(run.max_abs, float(err.max()))
    nz = e != 0
    if bool(nz.any()):
        run.max_rel = max(run.max_rel, float((err[nz] / e[nz].abs()).max()))
    if bool(((~nz) & (err > 0)).any()):
        run.max_rel = math.inf
    bad = ~(err <= atol + rtol * e.abs().masked_fill(both_nan, 0))
    count = int(bad.sum())
    if count and run.first_bad is None:
        i = int(bad.nonzero()[0, 0])
        run.first_bad = offset + i
        got = a[i: i + _SHOWN_VALUES].tolist()
        want = e[i: i + _SHOWN_VALUES].tolist()
        run.shown = f"got {_fmt(got)}, expected {_fmt(want)}"
    run.bad += count


def _fmt(values: list[Any]) -> str:
    return "[" + ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values) + "]"


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size if size else 0)
        flat = flat // size if size else 0
    return tuple(reversed(out))


def diff(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, check_dtype: bool = True) -> TensorDiff:
    """Max abs error, max rel error (|a-e|/|e| over elements with e != 0) and allclose; NaNs
    compare equal to NaNs in the same places. Runs chunk by chunk (bounded memory); ``detail``
    says, when they differ, the shape, dtype, first index outside the tolerance and a few values."""
    shape = tuple(expected.shape)
    if tuple(actual.shape) != shape:
        return TensorDiff(False, True, math.inf, math.inf, False, f"shape {list(actual.shape)} != {list(shape)}")
    dtype_ok = actual.dtype == expected.dtype or not check_dtype
    a_flat, e_flat = actual.detach().reshape(-1), expected.detach().reshape(-1)
    run = _Running()
    for start in range(0, e_flat.numel(), CHUNK_ELEMENTS):
        stop = start + CHUNK_ELEMENTS
        if a_flat.dtype == e_flat.dtype and a_flat.device == e_flat.device and torch.equal(
                a_flat[start:stop], e_flat[start:stop]):
            continue  # bitwise equal (the usual case): nothing to measure
        _compare_chunk(_as_float64(a_flat[start:stop]), _as_float64(e_flat[start:stop]), start, rtol, atol, run)
    parts = [] if dtype_ok else [f"dtype {actual.dtype} != {expected.dtype}"]
    if run.first_bad is not None:
        parts.append(
            f"shape {list(shape)} {str(expected.dtype).removeprefix('torch.')}: {run.bad} of {e_flat.numel()} "
            f"elements outside tolerance, first at index {list(_index(run.first_bad, shape))}: {run.shown}"
        )
    return TensorDiff(True, dtype_ok, run.max_abs, run.max_rel, run.first_bad is None and dtype_ok, "; ".join(parts))
