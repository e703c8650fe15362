"""Comparing a candidate's outputs with the reference: per-dtype tolerances scaled by the output,
a relative L2 bound, the room eager's own rounding sensitivity leaves (ill-conditioned elements),
and a float64 oracle that knows eager's own error.

Every comparison streams over chunks of :data:`~modulelens.numerics.CHUNK_ELEMENTS` elements
(each chunk converted to float64 on its own), so validating a module with multi-GiB outputs needs
a few chunks of float64, never a float64 copy of the whole output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from modulelens.numerics import CHUNK_ELEMENTS, tolerances
from modulelens.validation.inputs import tensors
from modulelens.validation.report import Accuracy, finite_or_none

_REL_L2 = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
ORACLE_MULTIPLE = 4.0
"""A candidate whose error against the float64 oracle is at most this multiple of eager's own error
against it (plus one unit of rounding at the output's scale) is accepted."""


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one dimension (a view when it is contiguous, else a copy)."""
    return t.detach().reshape(-1)


def _chunks(*ts: torch.Tensor | None) -> Iterator[tuple[torch.Tensor | None, ...]]:
    """Matching chunks of the flattened tensors (None stays None)."""
    flats = [_flat(t) if t is not None else None for t in ts]
    n = next(f.numel() for f in flats if f is not None)
    for start in range(0, n, CHUNK_ELEMENTS):
        yield tuple(f[start:start + CHUNK_ELEMENTS] if f is not None else None for f in flats)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN equal to NaN), compared chunk by chunk."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    floating = a.is_floating_point() or a.is_complex()
    for x, y in _chunks(a, b):
        if torch.equal(x, y):
            continue
        if not floating or not bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all()):
            return False
    return True


def _structure(got: torch.Tensor, want: torch.Tensor) -> str:
    """Why ``got`` cannot stand for ``want`` whatever its values (shape, dtype, device, layout), or ''."""
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)} != expected {list(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != expected {want.dtype}"
    if got.device != want.device:
        return f"device {got.device} != expected {want.device}"
    if got.layout != want.layout:
        return f"layout {got.layout} != expected {want.layout}"
    return ""


@dataclass
class _Special:
    """What a first pass over (got, want) finds: NaN and infinity mismatches, the largest finite
    reference value, the squared norm of the finite reference, and which chunks differ at all."""

    extra_nan: int = 0
    missing_nan: int = 0
    inf_differ: bool = False
    finite: int = 0
    scale: float = 0.0
    want_sq: float = 0.0
    differ: int = 0


def _specials(got: torch.Tensor, want: torch.Tensor) -> _Special:
    s = _Special()
    for g, w in _chunks(got, want):
        finite = torch.isfinite(w)
        all_finite = bool(finite.all())
        wf = w if all_finite else torch.where(finite, w, torch.zeros((), dtype=w.dtype))
        s.finite += w.numel() if all_finite else int(finite.sum())
        if wf.numel():
            s.scale = max(s.scale, float(wf.abs().max()))
            s.want_sq += float(torch.linalg.vector_norm(wf, dtype=torch.float64)) ** 2
        if torch.equal(g, w) and all_finite:
            continue  # bitwise equal and finite (the usual case): nothing else to look at
        s.differ += 1
        nan_g, nan_w = torch.isnan(g), torch.isnan(w)
        s.extra_nan += int((nan_g & ~nan_w).sum())
        s.missing_nan += int((nan_w & ~nan_g).sum())
        inf_w = torch.isinf(w)
        if not torch.equal(torch.isinf(g), inf_w) or not torch.equal(g[inf_w], w[inf_w]):
            s.inf_differ = True
    return s


def position_text(flat: int, shape: torch.Size) -> str:
    """The index ``[i, j, ...]`` of flat position ``flat`` in a tensor of ``shape``."""
    idx = []
    for s in reversed(shape):
        idx.append(flat % s)
        flat //= s
    return "[" + ", ".join(map(str, reversed(idx))) + "]"


def _value(v: float) -> str:
    return "NaN" if math.isnan(v) else f"{v:g}"


def first_nonfinite_mismatch(got: torch.Tensor, want: torch.Tensor) -> str:
    """Where ``got`` first breaks the non-finite semantics of ``want`` (same shape): NaN where the
    reference has none or a number where it has NaN, or an infinity of another sign or place;
    as ``at [i, j]: expected X, got Y`` ('' when there is none)."""
    start = 0
    for g, w in _chunks(got, want):
        nan_g, nan_w = torch.isnan(g), torch.isnan(w)
        inf_g, inf_w = torch.isinf(g), torch.isinf(w)
        bad = (nan_g != nan_w) | ((inf_g | inf_w) & ~nan_g & ~nan_w & (g != w))
        hits = torch.nonzero(bad)
        if hits.numel():
            k = int(hits[0])
            return f"at {position_text(start + k, want.shape)}: expected {_value(float(w[k]))}, got {_value(float(g[k]))}"
        start += w.numel()
    return ""


def compare_output(got: torch.Tensor, want: torch.Tensor, rtol: float | None, atol: float | None,
                   noise: torch.Tensor | None = None) -> tuple[bool, str]:
    """allclose with per-dtype tolerances where atol shrinks with the output's own scale, plus a
    relative L2 error bound: outputs near zero cannot pass by being zero. ``noise`` (optional) is
    how far eager itself moves when its inputs move by a rounding error: ill-conditioned elements
    (a mean of +-1e4 values that is near 0) get that much more room. Streams over chunks."""
    problem = _structure(got, want)
    if problem:
        return False, problem
    if not (want.is_floating_point() or want.is_complex()):
        differ = sum(int((g != w).sum()) for g, w in _chunks(got, want))
        return differ == 0, "" if differ == 0 else f"{differ} of {want.numel()} values differ"
    r, a = tolerances(want.dtype)
    r = rtol if rtol is not None else r
    a = atol if atol is not None else a
    s = _specials(got, want)
    if s.extra_nan or s.missing_nan or s.inf_differ:
        where = first_nonfinite_mismatch(got, want)
        if s.extra_nan:
            why = f"{s.extra_nan} NaN where the reference has a number"
        elif s.missing_nan:
            why = f"{s.missing_nan} NaN of the reference missing"
        else:
            why = "infinities differ from the reference in sign or place"
        return False, why + (f", first {where}" if where else "") + (
            " (memory the kernel did not write?)" if s.extra_nan and not s.missing_nan else "")
    if s.finite == 0 or not s.differ:
        return True, ""
    # Absolute room: the dtype's atol, shrunk for small outputs (zeros cannot pass for tiny results) and
    # grown to a few units of rounding of the largest output (elements near zero in a large output
    # carry the rounding error of their large neighbours).
    atol_eff = max(a * min(1.0, s.scale), 8 * torch.finfo(want.dtype).eps * s.scale)
    bad, max_err, diff_sq = 0, 0.0, 0.0
    for g, w, n in _chunks(got, want, noise if noise is not None and noise.shape == want.shape else None):
        if torch.equal(g, w):
            continue
        finite = torch.isfinite(w)
        gf, wf = g.double()[finite], w.double()[finite]
        err = (gf - wf).abs()
        room = atol_eff + r * wf.abs()
        if n is not None:
            room = room + 4 * n.double()[finite].nan_to_num(nan=0.0)  # no room from NaN noise
        bad += int((err > room).sum())
        if err.numel():
            max_err = max(max_err, float(err.max()))
            diff_sq += float((err * err).sum())
    rel_l2 = math.sqrt(diff_sq) / max(math.sqrt(s.want_sq), 1e-300)
    bound = _REL_L2.get(want.dtype, 1e-3) if rtol is None else max(rtol, 1e-12) * 10
    if bad or rel_l2 > bound:
        return False, (f"{bad} of {s.finite} values outside tolerance (max abs err {max_err:.3g}, "
                       f"rel L2 err {rel_l2:.3g}, output scale {s.scale:.3g}, rtol {r:g}, atol {atol_eff:.3g})")
    return True, ""


@dataclass
class OracleErrors:
    """Errors of one output against the float64 oracle, over the elements where the oracle is
    finite: the largest absolute error and the relative L2 error."""

    max_abs: float
    rel_l2: float


def oracle_errors(t: torch.Tensor, oracle: torch.Tensor) -> OracleErrors:
    """``t``'s errors against ``oracle`` (same shape), streamed; non-finite values of ``t`` where
    the oracle is finite count as infinite errors."""
    max_abs, diff_sq, ref_sq = 0.0, 0.0, 0.0
    for x, o in _chunks(t, oracle):
        o = o.double()
        finite = torch.isfinite(o)
        of, xf = o[finite], x.double()[finite]
        err = torch.nan_to_num((xf - of).abs(), nan=math.inf)
        if err.numel():
            max_abs = max(max_abs, float(err.max()))
            diff_sq += float((err * err).sum())
            ref_sq += float((of * of).sum())
    return OracleErrors(max_abs, math.sqrt(diff_sq) / max(math.sqrt(ref_sq), 1e-300) if diff_sq else 0.0)


def within_oracle(got: torch.Tensor, eager: torch.Tensor, oracle: torch.Tensor,
                  multiple: float = ORACLE_MULTIPLE) -> tuple[bool, OracleErrors, OracleErrors]:
    """Whether ``got`` is at least nearly as close to the float64 ``oracle`` as ``eager`` is: its
    max abs and relative L2 errors at most ``multiple`` times eager's, plus one unit of rounding at
    the output's scale; shape, dtype and the places of NaN and infinities as eager's. Returns
    (accepted, candidate's errors, eager's errors)."""
    mine, eagers = oracle_errors(got, oracle), oracle_errors(eager, oracle)
    if _structure(got, eager) or not lower_precision(eager):
        return False, mine, eagers
    s = _specials(got, eager)
    if s.extra_nan or s.missing_nan or s.inf_differ:
        return False, mine, eagers
    eps = torch.finfo(eager.dtype).eps
    ok = (mine.max_abs <= multiple * eagers.max_abs + eps * s.scale
          and mine.rel_l2 <= multiple * eagers.rel_l2 + eps)
    return ok, mine, eagers


def judged_by_oracle(got: torch.Tensor, eager: torch.Tensor, oracle: torch.Tensor, case: str, output: int,
                     why: str) -> tuple[bool, Accuracy, str]:
    """:func:`within_oracle` as a report sees it: (accepted, the :class:`Accuracy` entry, ``why``
    the plain tolerance failed followed by both errors and the decision)."""
    ok, mine, eagers = within_oracle(got, eager, oracle)
    entry = Accuracy(case=case, output=output, candidate_max_abs=finite_or_none(mine.max_abs),
                     eager_max_abs=finite_or_none(eagers.max_abs), candidate_rel_l2=finite_or_none(mine.rel_l2),
                     eager_rel_l2=finite_or_none(eagers.rel_l2), allowed_multiple=ORACLE_MULTIPLE, accepted=ok)
    return ok, entry, (f"{why}; against the float64 oracle its max abs error is {mine.max_abs:.3g} (eager's "
                       f"{eagers.max_abs:.3g}), rel L2 {mine.rel_l2:.3g} (eager's {eagers.rel_l2:.3g}): "
                       f"{'accepted' if ok else 'still rejected'} (at most {ORACLE_MULTIPLE:g}x eager's)")


def lower_precision(t: torch.Tensor) -> bool:
    """A floating tensor below float64 (a float64 oracle is more precise than it)."""
    return t.is_floating_point() and t.dtype != torch.float64


def float64_args(values: list) -> list:
    """``values`` with floating tensors (below float64) as float64 copies: an oracle's inputs."""
    return [v.detach().to(torch.float64) if isinstance(v, torch.Tensor) and lower_precision(v) else v for v in values]


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
