"""Parameter statistics across one sampled optimizer step: weight and gradient norms before the
step, and the update-to-weight ratio ``||w_after - w_before|| / ||w_before||``.

Norms are taken with fused ``_foreach`` calls and stay on the parameters' device until the step is
materialised (:func:`scalars_to_host`: one transfer per device). The weights before the step are
kept as copies of :func:`update_sample` (exact up to :data:`UPDATE_SAMPLE` elements)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from modulelens.stats import stats as S

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


def fused_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms of many tensors in one fused call, redone in float64 where the tensor's own
    precision overflowed (on the CPU, where checking is free; on a GPU in float64 directly)."""
    if tensors[0].device.type not in S.HOST_PATH_DEVICES:
        return list(torch._foreach_norm(tensors, 2, dtype=torch.float64))
    norms = list(torch._foreach_norm(tensors))
    for i, n in enumerate(norms):
        if not math.isfinite(float(n)) and tensors[i].dtype != torch.float64:
            norms[i] = torch.linalg.vector_norm(tensors[i], dtype=torch.float64)
    return norms


def scalars_to_host(scalars: list[torch.Tensor | float]) -> list[float]:
    """Host floats of many scalars (device tensors or floats): one transfer per device."""
    out = [s if isinstance(s, float) else 0.0 for s in scalars]
    by_device: dict[torch.device, list[int]] = {}
    for i, s in enumerate(scalars):
        if not isinstance(s, float):
            by_device.setdefault(s.device, []).append(i)
    for idx in by_device.values():
        vals = torch.stack([scalars[i].reshape(()).to(torch.float64) for i in idx]).cpu().tolist()  # type: ignore[union-attr]
        for i, v in zip(idx, vals):
            out[i] = v
    return out


@dataclass
class UpdateMeasurement:
    """Device-side parameter measurements of one sampled optimizer step."""

    # name -> (numel, ||w||, ||grad|| or None), norms as device scalars.
    norms: dict[str, tuple[int, torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)
    # id(param) -> (name, copy of its update sample before the step).
    before: dict[int, tuple[str, torch.Tensor]] = field(default_factory=dict)
    # name -> (||w_after - w_before||, ||w_before||) on the update sample.
    updates: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def before_step(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Before ``optimizer.step()``: norms of the weights and gradients of ``named`` (strided
        parameters), and a copy of each update sample."""
        if not named:
            return
        ws = [p.detach() for _, p in named]
        with_grad = [(n, p.grad.detach()) for n, p in named if p.grad is not None and p.grad.layout == torch.strided]
        grad_norms = dict(zip([n for n, _ in with_grad], fused_norms([g for _, g in with_grad]))) if with_grad else {}
        for (name, p), w, wn in zip(named, ws, fused_norms(ws)):
            self.norms[name] = (w.numel(), wn, grad_norms.get(name))
            self.before[id(p)] = (name, update_sample(w).clone())

    def after_step(self, params: list[torch.Tensor]) -> None:
        """After ``optimizer.step()``: the update norms of those of ``params`` measured before."""
        names, afters, befores = [], [], []
        for p in params:
            entry = self.before.pop(id(p), None)
            if entry is not None:
                names.append(entry[0])
                afters.append(update_sample(p.detach()))
                befores.append(entry[1])
        if not names:
            return
        base = fused_norms(befores)
        torch._foreach_sub_(befores, afters)  # the copies become -(update): no new memory
        for name, dn, bn in zip(names, fused_norms(befores), base):
            self.updates[name] = (dn, bn)
