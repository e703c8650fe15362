"""Parameter statistics across one sampled optimizer step: weight and gradient norms before the
step, and the update-to-weight ratio ``||w_after - w_before|| / ||w_before||``.

Norms are taken with fused ``_foreach`` calls and stay on the parameters' device until the step is
materialised (:func:`scalars_to_host`: one transfer per device). The weights before the step are
kept as copies of :func:`update_sample` (exact up to :data:`UPDATE_SAMPLE` elements)."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from modulelens.stats import fused
from modulelens.stats import stats as S
from modulelens.stats.fused import zero_rows_cpu

UPDATE_SAMPLE = 1 << 16


def update_layout(w: torch.Tensor, k: int = UPDATE_SAMPLE) -> tuple[int, int, int] | None:
    """Where :func:`update_sample` reads a contiguous ``w``: (rows, columns, row stride), in elements
    of ``w`` from its start; None when ``w`` is not contiguous."""
    if not w.is_contiguous():
        return None
    n = w.numel()
    if n <= k:
        return (1, n, n)
    if w.dim() >= 2:
        per_row = n // w.shape[0]
        if per_row <= 4 * k:
            every = max(1, n // k)
            return (-(-w.shape[0] // every), per_row, every * per_row)
    stride = S.strided_step(n, k, w.shape[-1] if w.dim() else 1)
    return (-(-n // stride), 1, stride)


def update_sample(w: torch.Tensor, k: int = UPDATE_SAMPLE) -> torch.Tensor:
    """The elements the update-to-weight ratio is measured on (a view: no memory needed to remember
    it): all of them up to ``k``; else every s-th slice along the first dimension (about ``k``
    elements, every column covered, contiguous runs of memory: a strided gather of single elements
    touches a cache line per element); else (slices over ``4 k`` elements, non-contiguous) a strided
    view of about ``k`` elements covering every column."""
    layout = update_layout(w, k)
    if layout is None:
        return S.strided(w.reshape(-1), k, w.shape[-1] if w.dim() else 1)
    rows, cols, stride = layout
    flat = w.reshape(-1)
    return flat if rows == 1 else flat.as_strided((rows, cols), (stride, 1))


def dead_row_layout(grad: torch.Tensor) -> tuple[int, int, int]:
    """(rows, columns, row stride) of the rows of ``grad`` that :func:`dead_rows` reads: every row, or
    every s-th row of a gradient over :data:`UPDATE_SAMPLE` elements."""
    every = max(1, grad.numel() // UPDATE_SAMPLE) if grad.numel() > UPDATE_SAMPLE else 1
    cols = grad.numel() // max(grad.shape[0], 1)
    return -(-grad.shape[0] // every), cols, every * cols


def dead_rows(grad: torch.Tensor, previous: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | float]:
    """(the rows of ``grad`` that are exactly zero, the fraction of rows zero here and in
    ``previous``, this weight's zero rows on the previous sampled step, when there was one): a unit
    that fires for some inputs only (a sparse router) gets gradient on some steps; a dead one on none."""
    rows, cols, stride = dead_row_layout(grad)
    every = stride // max(cols, 1)
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


class _HostSample(NamedTuple):
    """The update sample of a CPU parameter copied by the C helper (:meth:`UpdateMeasurement.before_step`)."""

    dtype: torch.dtype
    numel: int
    layout: tuple[int, int, int]  # rows, columns, row stride (see update_layout)
    copy: int  # address of the copy, inside UpdateMeasurement.buffers


class HostState:
    """What the C path keeps from one sampled step to the next: how it reads each CPU parameter
    (:class:`HostLayout`, by ``id()``) and the buffer the update samples are copied into (reused:
    a fresh multi-megabyte buffer costs a page fault per 4 KiB on every sampled step)."""

    def __init__(self) -> None:
        self.layouts: dict[int, HostLayout] = {}
        self.copies = torch.empty(0, dtype=torch.uint8)

    def buffer(self, nbytes: int) -> torch.Tensor:
        if self.copies.numel() < nbytes:
            self.copies = torch.empty(nbytes, dtype=torch.uint8)
        return self.copies


class HostLayout(NamedTuple):
    """How the C helper reads a contiguous CPU parameter: kept from step to step (:class:`HostState`)
    while the parameter keeps its dtype and shape."""

    ref: weakref.ref
    dtype: torch.dtype
    shape: torch.Size
    code: int
    numel: int
    sample: tuple[int, int, int]  # update_layout
    copy_bytes: int  # room for the copy of the sample, a multiple of 8
    rows: tuple[int, int, int] | None  # dead_row_layout of its gradient (None: a vector or a table)


def host_layout(p: torch.Tensor, table: bool) -> HostLayout | None:
    """The C helper's layout of a parameter, or None when it cannot read it (not a non-empty
    contiguous float32/float64/bfloat16 CPU tensor)."""
    code = fused.dtype_code(p)
    if code is None or p.numel() == 0:
        return None
    sample = update_layout(p)
    copy_bytes = -(-sample[0] * sample[1] * p.element_size() // 8) * 8  # type: ignore[index]
    rows = dead_row_layout(p) if p.dim() >= 2 and not table else None
    return HostLayout(weakref.ref(p), p.dtype, p.shape, code, p.numel(), sample, copy_bytes, rows)  # type: ignore[arg-type]


@dataclass
class UpdateMeasurement:
    """Parameter measurements of one sampled optimizer step: device scalars on GPUs, host floats for
    CPU parameters (measured by the C helper in one call before the step and one after it)."""

    # name -> (numel, ||w||, ||grad|| or None, fraction of rows with a zero gradient or None).
    norms: dict[str, tuple[int, torch.Tensor | float, torch.Tensor | float | None, torch.Tensor | float | None]] = \
        field(default_factory=dict)
    # id(param) -> (name, copy of its update sample before the step, its norm).
    before: dict[int, tuple[str, torch.Tensor | _HostSample, torch.Tensor | float]] = field(default_factory=dict)
    # name -> (||w_after - w_before||, ||w_before||) on the update sample.
    updates: dict[str, tuple[torch.Tensor | float, torch.Tensor | float]] = field(default_factory=dict)
    buffers: list[torch.Tensor] = field(default_factory=list)  # the host copies (kept until after the step)
    on_device: bool = False  # some norms are tensors (the PyTorch path): materialize moves them to the host
    frozen: set[str] = field(default_factory=set)  # measured parameters with requires_grad False

    def before_step(self, named: list[tuple[str, torch.Tensor]], zero_rows: dict[str, torch.Tensor],
                    tables: set[str] = frozenset(), host: HostState | None = None) -> None:  # type: ignore[assignment]
        """Before ``optimizer.step()``: norms of the weights and gradients of ``named`` (strided
        parameters), the rows of each gradient that were zero on this sampled step and the previous
        one (:func:`dead_rows`; ``zero_rows`` keeps each weight's zero rows from step to step; not for
        ``tables``, embeddings, whose rows are entries), and a copy of each update sample.
        ``host``: what the C path keeps from step to step."""
        self.frozen.update(name for name, p in named if not p.requires_grad)
        rest = named
        if named and fused.available():
            rest = self._before_step_host(named, zero_rows, tables, HostState() if host is None else host)
        if rest:
            self._before_step_torch(rest, zero_rows, tables)

    def _before_step_host(self, named: list[tuple[str, torch.Tensor]], zero_rows: dict[str, torch.Tensor],
                          tables: set[str], host: HostState) -> list[tuple[str, torch.Tensor]]:
        """The C path for contiguous CPU parameters (and gradients) in float32/float64/bfloat16: one
        call for all of them. Returns the parameters it cannot read."""
        rest: list[tuple[str, torch.Tensor]] = []
        chosen: list[tuple[str, torch.Tensor, torch.Tensor | None, HostLayout]] = []
        copy_bytes = 0
        layouts = host.layouts
        for name, p in named:
            lay = layouts.get(id(p))
            if lay is None or lay.ref() is not p or lay.dtype is not p.dtype or lay.shape != p.shape \
                    or not p.is_cpu or not p.is_contiguous():
                lay = host_layout(p, name in tables)
                if lay is None:
                    rest.append((name, p))
                    continue
                layouts[id(p)] = lay
            g = p.grad
            if g is not None and (g.layout is not torch.strided or not g.is_cpu or not g.is_contiguous()
                                  or fused.DTYPES.get(g.dtype) is None or g.shape != lay.shape):
                rest.append((name, p))
                continue
            chosen.append((name, p, g, lay))
            copy_bytes += lay.copy_bytes
        if not chosen:
            return rest
        # The shared buffer, unless copies of this step still wait in it (optimizers stepping interleaved).
        copies = host.buffer(copy_bytes) if not self.buffers else torch.empty(copy_bytes, dtype=torch.uint8)
        self.buffers.append(copies)
        records: list[int] = []
        samples: list[_HostSample] = []
        copy_at = copies.data_ptr()
        for name, p, g, lay in chosen:
            state = 0
            if lay.rows is not None and g is not None:
                mask = zero_rows.get(name)
                if mask is None or mask.dtype is not torch.uint8 or mask.shape[0] != lay.rows[0] or not mask.is_cpu:
                    mask = zero_rows[name] = torch.ones(lay.rows[0], dtype=torch.uint8)  # no previous step yet
                state = mask.data_ptr()
            records += (p.data_ptr(), lay.code, lay.numel, g.data_ptr() if g is not None else 0,
                        fused.DTYPES[g.dtype] if g is not None else -1, *lay.sample, copy_at,
                        *(lay.rows if lay.rows is not None else (0, 0, 0)), state)
            samples.append(_HostSample(lay.dtype, lay.numel, lay.sample, copy_at))
            copy_at += lay.copy_bytes
        out = fused.param_before_cpu(records, len(chosen))
        sqrt = math.sqrt
        for i, ((name, p, g, lay), sample) in enumerate(zip(chosen, samples)):
            w_sq, g_sq, c_sq, both = out[4 * i: 4 * i + 4]
            dead = both / max(lay.rows[0], 1) if lay.rows is not None and g is not None else None
            self.norms[name] = (lay.numel, sqrt(w_sq), sqrt(g_sq) if g is not None else None, dead)
            self.before[id(p)] = (name, sample, sqrt(c_sq))
        return rest

    def _before_step_torch(self, named: list[tuple[str, torch.Tensor]], zero_rows: dict[str, torch.Tensor],
                           tables: set[str]) -> None:
        self.on_device = True
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
        host_names, host_base, records = [], [], []
        for p in params:
            entry = self.before.pop(id(p), None)
            if entry is None:
                continue
            name, copy, norm = entry
            if isinstance(copy, _HostSample):
                if p.dtype is not copy.dtype or p.numel() != copy.numel or not p.is_cpu or not p.is_contiguous():
                    continue  # the parameter was replaced during the step: no ratio
                host_names.append(name)
                host_base.append(norm)
                records += (p.data_ptr(), fused.DTYPES[copy.dtype], *copy.layout, copy.copy)
            else:
                names.append(name)
                afters.append(update_sample(p.detach()))
                befores.append(copy)
                base.append(norm)
        if host_names:
            for name, d_sq, bn in zip(host_names, fused.param_after_cpu(records, len(host_names)), host_base):
                self.updates[name] = (math.sqrt(d_sq), bn)
        if not self.before:
            self.buffers.clear()
        if not names:
            return
        torch._foreach_sub_(befores, afters)  # the copies become -(update): no new memory
        for name, dn, bn in zip(names, fused_norms(befores), base):
            self.updates[name] = (dn, bn)
