"""Comparing tensors: errors and per-dtype tolerances, in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# (rtol, atol) like torch.testing's defaults for each dtype.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}


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


def diff(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, check_dtype: bool = True) -> TensorDiff:
    """Max abs error, max rel error (|a-e|/|e| over elements with e != 0) and allclose; NaNs
    compare equal to NaNs in the same places."""
    if tuple(actual.shape) != tuple(expected.shape):
        return TensorDiff(False, True, math.inf, math.inf, False, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    dtype_ok = actual.dtype == expected.dtype or not check_dtype
    a = actual.detach().to("cpu", torch.float64) if not actual.is_complex() else actual.detach().cpu()
    e = expected.detach().to("cpu", torch.float64) if not expected.is_complex() else expected.detach().cpu()
    if a.numel() == 0:
        return TensorDiff(True, dtype_ok, 0.0, 0.0, dtype_ok)
    both_nan = torch.isnan(a) & torch.isnan(e)
    same_inf = torch.isinf(a) & (a == e)
    err = (a - e).abs().masked_fill(both_nan | same_inf, 0.0)
    err = torch.nan_to_num(err, nan=math.inf)
    max_abs = float(err.max())
    nz = e != 0
    rel = err[nz] / e[nz].abs() if bool(nz.any()) else err.new_zeros(1)
    max_rel = float(rel.max()) if rel.numel() else 0.0
    if bool(((~nz) & (err > 0)).any()):
        max_rel = math.inf
    ok = bool((err <= atol + rtol * e.abs().masked_fill(both_nan, 0)).all())
    detail = "" if dtype_ok else f"dtype {actual.dtype} != {expected.dtype}"
    return TensorDiff(True, dtype_ok, max_abs, max_rel, ok and dtype_ok, detail)
