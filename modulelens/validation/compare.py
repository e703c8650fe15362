"""Comparing a candidate's outputs with the reference: per-dtype tolerances scaled by the output,
a relative L2 bound, and the room eager's own rounding sensitivity leaves (ill-conditioned
elements)."""

from __future__ import annotations

import torch

from modulelens.numerics import tolerances
from modulelens.validation.inputs import tensors

_REL_L2 = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN equal to NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def compare_output(got: torch.Tensor, want: torch.Tensor, rtol: float | None, atol: float | None,
                   noise: torch.Tensor | None = None) -> tuple[bool, str]:
    """allclose with per-dtype tolerances where atol shrinks with the output's own scale, plus a
    relative L2 error bound: outputs near zero cannot pass by being zero. ``noise`` (optional) is
    how far eager itself moves when its inputs move by a rounding error: ill-conditioned elements
    (a mean of +-1e4 values that is near 0) get that much more room."""
    if tuple(got.shape) != tuple(want.shape):
        return False, f"shape {list(got.shape)} != expected {list(want.shape)}"
    if got.dtype != want.dtype:
        return False, f"dtype {got.dtype} != expected {want.dtype}"
    if got.device != want.device:
        return False, f"device {got.device} != expected {want.device}"
    if got.layout != want.layout:
        return False, f"layout {got.layout} != expected {want.layout}"
    if not (want.is_floating_point() or want.is_complex()):
        ok = torch.equal(got, want)
        return ok, "" if ok else f"{int((got != want).sum())} of {want.numel()} values differ"
    r, a = tolerances(want.dtype)
    r = rtol if rtol is not None else r
    a = atol if atol is not None else a
    g, w = got.detach().double(), want.detach().double()
    nan_w, nan_g = torch.isnan(w), torch.isnan(g)
    if not torch.equal(nan_w, nan_g):
        extra = int((nan_g & ~nan_w).sum())
        why = f"{extra} NaN where the reference has none" if extra else f"{int((nan_w & ~nan_g).sum())} NaN missing"
        return False, why + (" (memory the kernel did not write?)" if extra else "")
    finite = torch.isfinite(w)
    if not torch.equal(torch.isinf(g) & ~nan_g, torch.isinf(w)) or not torch.equal(g[torch.isinf(w)], w[torch.isinf(w)]):
        return False, "infinities differ from the reference"
    gf, wf = g[finite], w[finite]
    if wf.numel() == 0:
        return True, ""
    scale = float(wf.abs().max())
    # Absolute room: the dtype's atol, shrunk for small outputs (zeros cannot pass for tiny results) and
    # grown to a few units of rounding of the largest output (elements near zero in a large output
    # carry the rounding error of their large neighbours).
    atol_eff = max(a * min(1.0, scale), 8 * torch.finfo(want.dtype).eps * scale)
    err = (gf - wf).abs()
    room = atol_eff + r * wf.abs()
    if noise is not None:
        room = room + 4 * noise.detach().double()[finite]
    bad = err > room
    rel_l2 = float(torch.linalg.vector_norm(gf - wf) / max(float(torch.linalg.vector_norm(wf)), 1e-300))
    bound = _REL_L2.get(want.dtype, 1e-3) if rtol is None else max(rtol, 1e-12) * 10
    if bool(bad.any()) or rel_l2 > bound:
        return False, (f"{int(bad.sum())} of {wf.numel()} values outside tolerance (max abs err {float(err.max()):.3g}, "
                       f"rel L2 err {rel_l2:.3g}, output scale {scale:.3g}, rtol {r:g}, atol {atol_eff:.3g})")
    return True, ""


def eager_noise(op, args: list, kwargs: dict, inplace: bool) -> list[torch.Tensor] | None:
    """|eager(x) - eager(x')| where x' moves every floating input by about two units of rounding:
    the part of the result that rounding alone decides (large where the operator is ill-conditioned)."""
    g = torch.Generator().manual_seed(1234)

    def nudge(t):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            return t.clone() if isinstance(t, torch.Tensor) else t
        eps = torch.finfo(t.dtype).eps
        signs = torch.randint(0, 2, t.shape, generator=g).to(t.device, t.dtype) * 2 - 1
        return t * (1 + 2 * eps * signs)

    try:
        clean = tensors(op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **kwargs))
        a2 = [nudge(a) for a in args]
        moved = tensors(op(*a2, **{k: nudge(v) for k, v in kwargs.items()}))
    except Exception:  # noqa: BLE001 - then no extra room
        return None
    if inplace:
        return None
    return [(c.double() - m.double()).abs() if c.shape == m.shape and c.is_floating_point() else torch.zeros(())
            for c, m in zip(clean, moved)]
