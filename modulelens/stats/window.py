"""What one sampled step gathers while it runs (a :class:`Window`), and its turning into host values
(:func:`materialize`).

During the step everything stays as the hooks produced it: moment vectors are host lists on the
CPU and float64 device tensors on a GPU, so a GPU step never waits for the device; at the end of
the step :func:`materialize` moves them to the host in one transfer per device and merges the
calls of each module into a :class:`~modulelens.stats.records.StepRecord`.
"""

from __future__ import annotations

import collections
import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from modulelens.stats import softmax as SM
from modulelens.stats import stats as S
from modulelens.stats.records import ModuleStep, ParamStep, StepRecord
from modulelens.stats.updates import UpdateMeasurement, scalars_to_host

Vector = torch.Tensor | list[float]


@dataclass
class Reduced:
    """An input that an earlier call of the step output: its moment vector gives its norm."""

    vec: Vector


class Call:
    """One module call of the step (``name`` None: not recorded: a wrapper, outside the roots, or
    grad disabled). A plain class with slots: one is made for every module call of a sampled step."""

    __slots__ = ("module", "name", "finish", "in_norms", "in_numel", "out")

    def __init__(self, module: nn.Module, name: str | None):
        self.module = module
        self.name = name
        self.finish = -1  # the order in which the calls of the step returned (-1: never returned)
        self.in_norms: list[torch.Tensor | float | Reduced] = []
        self.in_numel = 0
        self.out: list[Vector] = []


@dataclass
class Window:
    step: int
    calls: list[Call] = field(default_factory=list)  # recorded calls, in start order
    stack: list[Call] = field(default_factory=list)
    finished: int = 0
    grads: dict[str, list[tuple[int, Vector]]] = field(default_factory=dict)
    grad_seq: int = 0
    grad_targets: dict[tuple[int, int], tuple[weakref.ref, list[str]]] = field(default_factory=dict)
    tensor_hooks: list[Any] = field(default_factory=list)
    memo: collections.deque = field(default_factory=lambda: collections.deque(maxlen=8))
    softmax: dict[str, list[tuple[str, Vector]]] = field(default_factory=dict)
    params_seen: set[int] = field(default_factory=set)
    updates: UpdateMeasurement = field(default_factory=UpdateMeasurement)
    open: bool = True

    def innermost(self) -> str | None:
        """The name of the innermost recorded call running now."""
        return next((c.name for c in reversed(self.stack) if c.name is not None), None)


def floating_tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The non-empty floating (or complex) tensors in a module's inputs or outputs."""
    if type(value) is tuple and len(value) == 1:  # the usual positional arguments: (x,)
        value = value[0]
    if isinstance(value, torch.Tensor):
        return [value] if (value.is_floating_point() or value.is_complex()) and value.numel() else []
    if depth > 3:
        return []
    if isinstance(value, (list, tuple)):
        return [t for v in value[:64] for t in floating_tensors(v, depth + 1)]
    if isinstance(value, dict):
        return [t for v in list(value.values())[:64] for t in floating_tensors(v, depth + 1)]
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        return [t for f in value.__dataclass_fields__ for t in floating_tensors(getattr(value, f, None), depth + 1)]
    return []


def saturation_of(module: nn.Module) -> tuple[float, float] | None:
    """(centre, half-range) of a bounded activation's output, or None."""
    name = type(module).__name__
    if name == "Hardtanh" or isinstance(module, nn.Hardtanh):
        lo, hi = float(module.min_val), float(module.max_val)
        return ((lo + hi) / 2, (hi - lo) / 2)
    return S.SATURATING.get(name)


def _softmax_to_host(vecs: list[Vector]) -> list[list[float]]:
    out: list[list[float]] = [v if isinstance(v, list) else [] for v in vecs]
    tensors = [i for i, v in enumerate(vecs) if not isinstance(v, list)]
    if tensors:
        rows = torch.stack([vecs[i] for i in tensors]).cpu().tolist()  # type: ignore[misc]
        for i, row in zip(tensors, rows):
            out[i] = row
    return out


def materialize(win: Window, owners: dict[str, str]) -> StepRecord:
    """The host record of a finished window (``owners``: parameter name -> owning module).
    ``modules`` of the record are in the start order of their first calls."""
    vecs: list[Vector] = []
    scalars: list[torch.Tensor | float] = []

    def vslot(v: Vector) -> int:
        vecs.append(v)
        return len(vecs) - 1

    def sslot(v: torch.Tensor | float | None) -> int | None:
        if v is None:
            return None
        scalars.append(v)
        return len(scalars) - 1

    def norm_slot(n: torch.Tensor | float | Reduced) -> tuple[bool, int]:
        return (True, vslot(n.vec)) if isinstance(n, Reduced) else (False, sslot(n))  # type: ignore[return-value]

    call_slots = [([vslot(v) for v in c.out], [norm_slot(n) for n in c.in_norms]) for c in win.calls]
    grad_slots = {n: [(seq, vslot(v)) for seq, v in lst] for n, lst in win.grads.items()}
    pnorm_slots = {n: (k, sslot(w), sslot(g), sslot(d)) for n, (k, w, g, d) in win.updates.norms.items()}
    upd_slots = {n: (sslot(d), sslot(b)) for n, (d, b) in win.updates.updates.items()}
    soft = [(name, src, v) for name, lst in win.softmax.items() for src, v in lst]
    host_v = S.to_host(vecs)
    host_s = scalars_to_host(scalars)
    host_soft = _softmax_to_host([v for _, _, v in soft])

    def norm(slot: tuple[bool, int]) -> float:
        from_vec, i = slot
        return S.l2_from_moments(host_v[i]) if from_vec else host_s[i]

    def bad(j: int) -> bool:
        return host_v[j][S.NAN] + host_v[j][S.INF] > 0

    rec = StepRecord(step=win.step)
    for c, (out_idx, in_idx) in zip(win.calls, call_slots):
        if c.finish < 0:
            continue  # never returned (an exception inside it)
        ms = rec.modules.get(c.name)  # type: ignore[arg-type]
        if ms is None:
            cls = type(c.module)
            ms = rec.modules[c.name] = ModuleStep(type=cls.__name__, class_path=f"{cls.__module__}:{cls.__qualname__}")  # type: ignore[index]
        ms.calls += 1
        ms.saturation = ms.saturation or saturation_of(c.module) is not None
        out = S.merge_all(host_v[i] for i in out_idx)
        if out is not None:
            ms.act = out if ms.act is None else S.merge(ms.act, out)
        norms = [norm(j) for j in in_idx]
        ms.in_sq += sum(x * x for x in norms if math.isfinite(x))
        ms.in_numel += c.in_numel
        ms.in_nonfinite = ms.in_nonfinite or any(not math.isfinite(x) for x in norms)
    for c, (out_idx, in_idx) in sorted(zip(win.calls, call_slots), key=lambda pair: pair[0].finish):
        if c.finish >= 0 and any(bad(j) for j in out_idx):
            rec.nonfinite.append((c.name, any(not math.isfinite(norm(j)) for j in in_idx)))  # type: ignore[arg-type]
    grad_events: list[tuple[int, str, bool]] = []
    for name, lst in grad_slots.items():
        if name in rec.modules:
            rec.modules[name].grad = S.merge_all(host_v[i] for _, i in lst)
            grad_events += [(seq, name, bad(i)) for seq, i in lst]
    for _, name, is_bad in sorted(grad_events):
        if is_bad and name not in rec.nonfinite_grads:
            rec.nonfinite_grads.append(name)
    for (name, src, _), v in zip(soft, host_soft):
        ms = rec.modules.get(name)
        if ms is not None:
            ms.softmax = SM.merge(ms.softmax, v)
            if src not in ms.softmax_sources:
                ms.softmax_sources.append(src)

    def scalar(i: int | None) -> float | None:
        return host_s[i] if i is not None else None

    for pname, (numel, wi, gi, di) in pnorm_slots.items():
        ps = rec.params[pname] = ParamStep(module=owners.get(pname, ""), numel=numel, weight_norm=host_s[wi],  # type: ignore[index]
                                           grad_norm=scalar(gi), dead_rows=scalar(di))
        if pname in upd_slots:
            dn, bn = (host_s[j] for j in upd_slots[pname])  # type: ignore[index]
            ps.update_ratio = dn / bn if bn > 0 and math.isfinite(dn) and math.isfinite(bn) else None
    return rec
