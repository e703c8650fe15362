"""Parameter statistics across one sampled optimizer step: weight and gradient norms before the
step, and the update-to-weight ratio ``||w_after - w_before|| / ||w_before||``.

Norms are taken with fused ``_foreach`` calls and stay on the parameters' device until the step is
materialised (:func:`scalars_to_host`: one transfer per device). The weights before the step are
kept as copies of :func:`update_sample` (exact up to :data:`UPDATE_SAMPLE` elements)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from modulelens.stats import stats as S
from modulelens.stats.fused import zero_rows_cpu

UPDATE_SAMPLE = 1 << 16


def update_sample(w: torch.Tensor, k: int = UPDATE_SAMPLE) -> torch.Tensor:
    """The elements the update-to-weight ratio is measured on (a view: no memory needed to remember
    it): all of them up to ``k``; else every s-th slice along the first dimension (about ``k``
    elements, every column covered, contiguous runs of memory: a strided gather of single elements
    touches a cache line per element); else (slices over ``4 k`` elements, non-contiguous) a strided
    view of about ``k`` elements covering every column."""
    n = w.numel()
    if n <= k:
        return w.reshape(-1)
    if w.dim() >= 2 and w.is_contiguous():
        per_row = n // w.shape[0]
        if per_row <= 4 * k:
            return w.reshape(w.shape[0], per_row)[:: max(1, n // k)]
    return S.strided(w.reshape(-1), k, w.shape[-1] if w.dim() else 1)


def dead_rows(grad: torch.Tensor, previous: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | float]:
    """(the rows of ``grad`` that are exactly zero, the fraction of rows zero here and in
    ``previous``, this weight's zero rows on the previous sampled step, when there was one): a unit
    that fires for some inputs only (a sparse router) gets gradient on some steps; a dead one on none."""
    every = max(1, grad.numel() // UPDATE_SAMPLE) if grad.numel() > UPDATE_SAMPLE else 1
    found = zero_rows_cpu(grad, every, previous)
    if found is not None:
        zero, both = found
        return zero, both / max(zero.numel(), 1)
    zero = torch.count_nonzero(grad.reshape(grad.shape[0], -1)[::every], dim=1) == 0
    both_mask = zero & previous if previous is not None and previous.shape == zero.shape else zero
    return zero, both_mask.sum(dtype=torch.float64) / max(zero.numel(), 1)


def fused_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms of many tensors in one fused call, redone in float64 where the tensor's own
    precision overflowed (on the CPU, where checking is free; on a GPU in float64 directly)."""
    if tensors[0].device.type not in S.HOST_PATH_DEVICES:
        return list(torch._foreach_norm(tensors, 2, dtype=torch.float64))
    norms = list(torch._foreach_norm(tensors))
    for i, ok in enumerate(torch.isfinite(torch.stack(norms)).tolist()):
        if not ok and tensors[i].dtype != torch.float64:
            norms[i] = torch.linalg.vector_norm(tensors[i], dtype=torch.float64)
    return norms


def scalars_to_host(scalars: list[torch.Tensor | float]) -> list[float]:
    """Host floats of many scalars (tensors or floats): on the CPU each read directly (a stack of
    hundreds of 0-d tensors costs ten times more), elsewhere one transfer per device."""
    out = [s if isinstance(s, float) else 0.0 for s in scalars]
    by_device: dict[torch.device, list[int]] = {}
    for i, s in enumerate(scalars):
        if not isinstance(s, float):
            if s.device.type == "cpu":
                out[i] = s.item()
            else:
                by_device.setdefault(s.device, []).append(i)
    for idx in by_device.values():
        vals = torch.stack([scalars[i].reshape(()).to(torch.float64) for i in idx]).cpu().tolist()  # type: ignore[union-attr]
        for i, v in zip(idx, vals):
            out[i] = v
    return out


@dataclass
class UpdateMeasurement:
    """Device-side parameter measurements of one sampled optimizer step."""

    # name -> (numel, ||w||, ||grad|| or None, fraction of rows with a zero gradient or None), as device scalars.
    norms: dict[str, tuple[int, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = field(default_factory=dict)
    # id(param) -> (name, copy of its update sample before the step, its norm).
    before: dict[int, tuple[str, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # name -> (||w_after - w_before||, ||w_before||) on the update sample.
    updates: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def before_step(self, named: list[tuple[str, torch.Tensor]], zero_rows: dict[str, torch.Tensor],
                    tables: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Before ``optimizer.step()``: norms of the weights and gradients of ``named`` (strided
        parameters), the rows of each gradient that were zero on this sampled step and the previous
        one (:func:`dead_rows`; ``zero_rows`` keeps each weight's zero rows from step to step; not for
        ``tables``, embeddings, whose rows are entries), and a copy of each update sample."""
        if not named:
            return
        ws = [p.detach() for _, p in named]
        with_grad = [(n, p.grad.detach()) for n, p in named if p.grad is not None and p.grad.layout == torch.strided]
        dead = {}
        for n, g in with_grad:
            if g.dim() >= 2 and n not in tables:
                zero_rows[n], dead[n] = dead_rows(g, zero_rows.get(n))
        samples = [update_sample(w) for w in ws]
        copies = [x.clone() for x in samples]
        # One fused call for the norms of the weights, their gradients and the copies.
        norms = fused_norms([*ws, *(g for _, g in with_grad), *copies])
        w_norms, g_norms, c_norms = norms[:len(ws)], norms[len(ws):len(ws) + len(with_grad)], norms[len(ws) + len(with_grad):]
        grad_norms = dict(zip([n for n, _ in with_grad], g_norms))
        for (name, p), w, wn, copy, cn in zip(named, ws, w_norms, copies, c_norms):
            self.norms[name] = (w.numel(), wn, grad_norms.get(name), dead.get(name))
            self.before[id(p)] = (name, copy, cn)

    def after_step(self, params: list[torch.Tensor]) -> None:
        """After ``optimizer.step()``: the update norms of those of ``params`` measured before."""
        names, afters, befores, base = [], [], [], []
        for p in params:
            entry = self.before.pop(id(p), None)
            if entry is not None:
                names.append(entry[0])
                afters.append(update_sample(p.detach()))
                befores.append(entry[1])
                base.append(entry[2])
        if not names:
            return
        torch._foreach_sub_(befores, afters)  # the copies become -(update): no new memory
        for name, dn, bn in zip(names, fused_norms(befores), base):
            self.updates[name] = (dn, bn)
