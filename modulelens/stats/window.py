"""What one sampled step gathers while it runs (a :class:`Window`), and its turning into host values
(:func:`materialize`).

During the step everything stays as the hooks produced it: moment vectors are host lists on the
CPU and float64 device tensors on a GPU, so a GPU step never waits for the device; at the end of
the step :func:`materialize` moves them to the host in one transfer per device and merges the
calls of each module into a :class:`~modulelens.stats.records.StepRecord`.
"""

from __future__ import annotations

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

    __slots__ = ("module", "name", "finish", "in_norms", "in_numel", "out", "saturating", "quiet")

    def __init__(self, module: nn.Module, name: str | None):
        self.module = module
        self.name = name
        self.saturating = False  # a bounded activation (its outputs count saturated elements)
        self.quiet = False  # the softmax observer was off the mode stack while it ran
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
    # id(output) -> (weak reference, version, saturation, moment vector): outputs already reduced this step.
    memo: dict[int, tuple[weakref.ref, int, Any, Vector]] = field(default_factory=dict)
    softmax: dict[str, list[tuple[str, Vector]]] = field(default_factory=dict)
    params_seen: set[int] = field(default_factory=set)
    updates: UpdateMeasurement = field(default_factory=UpdateMeasurement)
    open: bool = True
    on_device: bool = False  # some value above is a device tensor (GPU): materialize moves them first

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


def _to_host(win: Window) -> None:
    """Replace the device values of a window (GPU moment vectors, softmax vectors and scalars) by host
    values, moved in one transfer per device and kind; on the CPU there are none and this only looks."""
    vecs: list[tuple[Any, Any, torch.Tensor]] = []  # (container, key, value): where each one goes back
    soft: list[tuple[Any, Any, torch.Tensor]] = []
    scalars: list[tuple[Any, Any, torch.Tensor]] = []
    for c in win.calls:
        vecs += [(c.out, i, v) for i, v in enumerate(c.out) if type(v) is not list]
        for i, n in enumerate(c.in_norms):
            if type(n) is Reduced:
                if type(n.vec) is not list:
                    vecs.append((n, "vec", n.vec))  # type: ignore[arg-type]
            elif type(n) is not float:
                scalars.append((c.in_norms, i, n))  # type: ignore[arg-type]
    for lst in win.grads.values():
        vecs += [(lst, i, v) for i, (_, v) in enumerate(lst) if type(v) is not list]
    for lst in win.softmax.values():
        soft += [(lst, i, v) for i, (_, v) in enumerate(lst) if type(v) is not list]
    for name, entry in win.updates.norms.items():
        scalars += [(win.updates.norms, (name, j), v) for j, v in enumerate(entry[1:], 1) if v is not None and type(v) is not float]
    for name, entry in win.updates.updates.items():
        scalars += [(win.updates.updates, (name, j), v) for j, v in enumerate(entry) if type(v) is not float]
    if not (vecs or soft or scalars):
        return
    for spots, values in ((vecs, S.to_host([v for _, _, v in vecs])), (soft, _softmax_to_host([v for _, _, v in soft])),
                          (scalars, scalars_to_host([v for _, _, v in scalars]))):
        for (where, key, _), value in zip(spots, values):
            if isinstance(where, Reduced):
                where.vec = value
            elif isinstance(key, tuple):  # a field of a tuple in a dict: rebuild the tuple
                name, j = key
                entry = list(where[name])
                entry[j] = value
                where[name] = tuple(entry)
            elif isinstance(where[key], tuple):  # (seq or source, value) in a list
                where[key] = (where[key][0], value)
            else:
                where[key] = value


_CLASSES: dict[type, tuple[str, str]] = {}


def _module_step(module: nn.Module) -> ModuleStep:
    cls = type(module)
    names = _CLASSES.get(cls)
    if names is None:
        names = _CLASSES[cls] = (cls.__name__, f"{cls.__module__}:{cls.__qualname__}")
    return ModuleStep(type=names[0], class_path=names[1])


def _bad(v: list[float]) -> bool:
    return v[S.NAN] + v[S.INF] > 0


def materialize(win: Window, owners: dict[str, str]) -> StepRecord:
    """The host record of a finished window (``owners``: parameter name -> owning module).
    ``modules`` of the record are in the start order of their first calls."""
    if win.on_device or win.updates.on_device:
        _to_host(win)
    rec = StepRecord(step=win.step)
    modules = rec.modules
    isfinite = math.isfinite
    bad_calls: list[tuple[int, str, bool]] = []
    for c in win.calls:
        if c.finish < 0:
            continue  # never returned (an exception inside it)
        ms = modules.get(c.name)  # type: ignore[arg-type]
        if ms is None:
            ms = modules[c.name] = _module_step(c.module)  # type: ignore[index]
        ms.calls += 1
        ms.saturation = ms.saturation or c.saturating
        outs: list[list[float]] = c.out  # type: ignore[assignment]
        if outs:
            out = list(outs[0]) if len(outs) == 1 else S.merge_all(outs)
            ms.act = out if ms.act is None else S.merge(ms.act, out)  # type: ignore[arg-type]
        norms = [S.l2_from_moments(n.vec) if type(n) is Reduced else n for n in c.in_norms]  # type: ignore[arg-type]
        for n in c.in_norms:
            if type(n) is Reduced and n.vec[S.COUNT]:  # type: ignore[index]
                top = n.vec[S.MAX]  # type: ignore[index]
                ms.in_max = top if ms.in_max is None else max(ms.in_max, top)
            else:
                ms.in_max_known = False
        finite = [x for x in norms if isfinite(x)]  # type: ignore[arg-type]
        ms.in_sq += sum(x * x for x in finite)
        ms.in_numel += c.in_numel
        if len(finite) < len(norms):
            ms.in_nonfinite = True
        if any(_bad(v) for v in outs):
            bad_calls.append((c.finish, c.name, len(finite) < len(norms)))  # type: ignore[arg-type]
    rec.nonfinite = [(name, bad_in) for _, name, bad_in in sorted(bad_calls)]
    bad_grads: list[tuple[int, str]] = []
    for name, lst in win.grads.items():
        ms = modules.get(name)
        if ms is not None:
            ms.grad = list(lst[0][1]) if len(lst) == 1 else S.merge_all(v for _, v in lst)  # type: ignore[arg-type]
            bad_grads += [(seq, name) for seq, v in lst if _bad(v)]  # type: ignore[arg-type]
    for _, name in sorted(bad_grads):
        if name not in rec.nonfinite_grads:
            rec.nonfinite_grads.append(name)
    for name, lst in win.softmax.items():
        ms = modules.get(name)
        if ms is not None:
            for src, v in lst:
                ms.softmax = SM.merge(ms.softmax, v)  # type: ignore[arg-type]
                if src not in ms.softmax_sources:
                    ms.softmax_sources.append(src)
    updates = win.updates.updates
    for pname, (numel, wn, gn, dead) in win.updates.norms.items():
        ps = rec.params[pname] = ParamStep(module=owners.get(pname, ""), numel=numel, weight_norm=wn,  # type: ignore[arg-type]
                                           grad_norm=gn, dead_rows=dead,  # type: ignore[arg-type]
                                           requires_grad=pname not in win.updates.frozen)
        if pname in updates:
            dn, bn = updates[pname]
            ps.update_ratio = dn / bn if bn > 0 and isfinite(dn) and isfinite(bn) else None  # type: ignore[operator]
    return rec
