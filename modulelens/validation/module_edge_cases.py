"""The captured module's own edge cases, run in every module validation (eval mode) beside the
captured and fresh inputs (:mod:`modulelens.validation.module`).

Module inputs are told apart by their captured values (positions count ``forward``'s arguments,
then its keyword arguments, as shape rules do):

- an **attention mask** is a floating input holding ``-inf`` or very negative entries (at most
  :data:`MASKED_BELOW`: an additive mask such as ``finfo.min``, ``-1e9`` or ``-1e4``), or a bool
  input. An additive mask gets fully masked rows (rows along its last dimension: the captured
  partly masked rows extended to whole rows, else the first and last rows) and padded positions
  (the last quarter of the positions along its last dimension masked in every row, as a
  right-padded batch), masked with its own masked value (``-inf`` when it holds one, else its
  captured minimum). A bool mask's polarity is not known from its values (``True`` attends for
  ``scaled_dot_product_attention``, masks for ``nn.MultiheadAttention``), so it gets those cases
  with both values;
- every other floating input gets NaN and +-inf at random positions, and -0 with denormals
  (:func:`~modulelens.validation.edge_cases.special_value_cases`, as card validation does);
- the parameters get special values, on the captured inputs: every floating parameter zero, and
  scales negated (one-dimensional parameters named ``weight``, ``scale``, ``gamma`` or ``g``;
  tied tensors stay tied, buffers stay as captured).

Each case says what it is and where it came from (:class:`~modulelens.validation.edge_cases.EdgeCase`,
:class:`StateEdgeCase`), so the report lists them and a failure names the case in one line
("row 0 and row 1 of input 3 are all -inf (...)"). The expected outputs are the original module's on
the same values, compared with the exact non-finite semantics of :mod:`.compare`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from modulelens.validation.edge_cases import (
    EdgeCase,
    described,
    rows_of,
    rows_text,
    special_value_cases,
    tensor_like,
    unrows,
)
from modulelens.validation.report import ValidationReport

MASKED_BELOW = -1e4
"""A floating input with an entry at or below this (or ``-inf``) is taken for an additive mask."""
SCALE_NAMES = frozenset({"weight", "scale", "gamma", "g"})
"""The last name part of the one-dimensional parameters negated as scales."""
PADDED_SHARE = 4
"""Padded positions: the last 1/PADDED_SHARE of a mask's last dimension (at least one position)."""


@dataclass
class StateEdgeCase:
    """Parameters at special values: ``label`` says which, ``source`` where the case came from,
    ``state``: the whole state dict to load into both the original and the candidate."""

    label: str
    source: str
    state: dict[str, torch.Tensor]


def _flat(args: list, kwargs: dict) -> list:
    return [*args, *kwargs.values()]


def _split(flat: list, args: list, kwargs: dict) -> tuple[list, dict]:
    return list(flat[:len(args)]), dict(zip(kwargs, flat[len(args):]))


def _is_additive_mask(t: torch.Tensor) -> bool:
    if not t.is_floating_point() or t.numel() == 0 or t.dim() == 0:
        return False
    return bool((t.detach() <= MASKED_BELOW).any())


def _is_bool_mask(t: torch.Tensor) -> bool:
    return t.dtype == torch.bool and t.dim() >= 1 and t.numel() > 1


def _additive_mask_cases(flat: list, i: int) -> list[tuple[str, str, torch.Tensor]]:
    x = flat[i]
    rows = rows_of(x, -1)
    masked_value = -math.inf if bool(torch.isneginf(rows).any()) else float(rows.min())
    shown = "-inf" if masked_value == -math.inf else f"{masked_value:g} (its masked value)"
    is_masked = rows <= MASKED_BELOW
    partly = is_masked.any(1) & ~is_masked.all(1)
    captured = [int(r) for r in torch.nonzero(partly).flatten()[:2]]
    chosen = captured or sorted({0, rows.shape[0] - 1})
    full = rows.clone()
    full[chosen] = masked_value
    verb = "is" if len(chosen) == 1 else "are"
    how = "partly masked in the capture, extended to whole rows" if captured else "whole rows masked"
    out = [(f"{rows_text(chosen, x, -1)} of input {i} (an additive attention mask) {verb} all {shown} ({how})",
            "module: fully masked rows", unrows(full, x, -1))]
    length = rows.shape[1]
    if length > 1:
        k = max(1, length // PADDED_SHARE)
        padded = rows.clone()
        padded[:, length - k:] = masked_value
        out.append((f"the last {k} of {length} positions along the last dim of input {i} (an additive attention "
                    f"mask) are {shown} in every row (padded positions)", "module: padded positions",
                    unrows(padded, x, -1)))
    return out


def _bool_mask_cases(flat: list, i: int) -> list[tuple[str, str, torch.Tensor]]:
    x = flat[i]
    rows = x.detach().reshape(-1, x.shape[-1]).clone()
    chosen = sorted({0, rows.shape[0] - 1})
    where, verb = rows_text(chosen, x, -1), "is" if len(chosen) == 1 else "are"
    length = rows.shape[1]
    k = max(1, length // PADDED_SHARE)
    out = []
    for value in (False, True):
        full = rows.clone()
        full[chosen] = value
        out.append((f"{where} of input {i} (a bool attention mask) {verb} all {value} (fully masked rows where "
                    f"{value} masks)", "module: fully masked rows", full.reshape(x.shape)))
        if length > 1:
            padded = rows.clone()
            padded[:, length - k:] = value
            out.append((f"the last {k} of {length} positions along the last dim of input {i} (a bool attention "
                        f"mask) are {value} in every row (padded positions where {value} masks)",
                        "module: padded positions", padded.reshape(x.shape)))
    return out


def input_edge_cases(args: list, kwargs: dict, seed: int = 0) -> list[EdgeCase]:
    """The edge cases of a module call's inputs (see the module docstring), each a whole call:
    one input changed, the others as captured; shapes, strides, dtypes and devices kept."""
    flat = _flat(args, kwargs)
    out: list[EdgeCase] = []
    for i, x in enumerate(flat):
        if not isinstance(x, torch.Tensor):
            continue
        if _is_bool_mask(x) or _is_additive_mask(x):
            made = _bool_mask_cases(flat, i) if x.dtype == torch.bool else _additive_mask_cases(flat, i)
            for label, source, values in made:
                changed = [tensor_like(a, values) if j == i else a for j, a in enumerate(flat)]
                a, k = _split(changed, args, kwargs)
                out.append(EdgeCase(label, source, a, k))
        elif x.is_floating_point() and x.numel() > 0:
            for case in special_value_cases(flat, {}, i, seed + i):
                a, k = _split(case.args, args, kwargs)
                out.append(EdgeCase(case.label, case.source, a, k))
    return out


def _special_state(state: dict[str, torch.Tensor], names: set[str], how) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``state`` with the tensors of ``names`` replaced by ``how(tensor)`` (tied tensors once, so they
    stay tied); (state, the names changed)."""
    out, changed, done = {}, [], {}
    for name, t in state.items():
        if name not in names:
            out[name] = t
            continue
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        if key not in done:
            done[key] = how(t.detach()).clone()
        out[name] = done[key]
        changed.append(name)
    return out, changed


def _names(changed: list[str]) -> str:
    return ", ".join(changed[:6]) + (" ..." if len(changed) > 6 else "")


def parameter_edge_cases(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> list[StateEdgeCase]:
    """Parameters at special values (see the module docstring), each a whole state dict made from
    the captured ``state``; [] for a module without floating parameters."""
    # every name a parameter goes by (state_dict lists tied parameters under each of their names)
    floating = {n for n, t in module.state_dict(keep_vars=True).items()
                if isinstance(t, torch.nn.Parameter) and t.is_floating_point() and t.numel() and n in state}
    out = []
    if floating:
        zeros, changed = _special_state(state, floating, torch.zeros_like)
        out.append(StateEdgeCase(f"every floating parameter is 0 ({_names(changed)})", "module: zero parameters",
                                 zeros))
    scales = {n for n in floating if state[n].dim() == 1 and n.rsplit(".", 1)[-1] in SCALE_NAMES}
    if scales:
        negated, changed = _special_state(state, scales, torch.neg)
        out.append(StateEdgeCase(f"scales negated ({_names(changed)} times -1)", "module: negative scales",
                                 negated))
    return out


def described_state(case: StateEdgeCase) -> str:
    """``case`` as a report lists it."""
    return f"{case.label}, on the captured inputs ({case.source})"


class ModuleEdgeChecks:
    """The module checker's edge-case step, mixed into it like
    :class:`~modulelens.validation.module_checks.ModuleChecks` (it uses the same checker methods:
    ``check``, ``check_case``, ``load_state``, ``restore_captured_state``)."""

    report: ValidationReport
    captured_state: dict[str, torch.Tensor]
    check: Any
    check_case: Any
    load_state: Any
    restore_captured_state: Any

    def check_edge_cases(self, reference: torch.nn.Module, args: list, kwargs: dict, seed: int = 0) -> str | None:
        """Eval on the input edge cases, then on the captured inputs with the parameters at special
        values (loaded into both sides; the captured state is loaded back afterwards); records every
        case in the report's ``edge_cases``; why the candidate fails (naming the case), or None."""
        inputs = input_edge_cases(args, kwargs, seed)
        states = parameter_edge_cases(reference, self.captured_state)
        self.report.edge_cases = [described(c) for c in inputs] + [described_state(c) for c in states]
        for case in inputs:
            problem = self.check_case(reference, case.args, case.kwargs, f"eval, edge case: {case.label}",
                                      training=False, rng=None)
            if problem:
                self.report.failed_edge_case = case.label
                return problem
        for case in states:
            reference.load_state_dict(case.state)
            error = self.load_state(case.state)
            if not self.check(f"takes other parameters (edge case: {case.label})", not error, error):
                return f"cannot take other parameters of the same shapes ({error})"
            problem = self.check_case(reference, args, kwargs, f"eval, edge case: {case.label}, captured inputs",
                                      training=False, rng=None)
            if problem:
                self.report.failed_edge_case = case.label
                return problem
        return self.restore_captured_state(reference) if states else None
