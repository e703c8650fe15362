"""The shape-rule cases of a card validation: a candidate that declares variable dimensions
(:mod:`modulelens.kernels.shape_rules`) is also checked on fresh inputs at sizes that were not
captured, with the same checks and tolerances as the captured sample.

:func:`rule_problem` says why a declared rule cannot apply to the card's sample (then the
candidate is rejected: it claims what it cannot be checked on); :func:`shape_rule_cases` gives the
extra cases, one per variable dimension and probe size (the other variable dimensions at their
captured sizes); :func:`checked_rule` is the rule as the report records it once every case passed.
"""

from __future__ import annotations

from typing import Any

import torch

from modulelens.kernels import ShapeRule, VariableDim, probe_sizes

SEED = 7919


def _values(args: list, kwargs: dict) -> list[Any]:
    return [*args, *kwargs.values()]


def rule_problem(rule: ShapeRule, args: list, kwargs: dict) -> str | None:
    """Why ``rule`` does not fit the sample call (positions as the entry point counts them), or None."""
    values = _values(args, kwargs)
    for d in rule.dims:
        sizes = set()
        for pos, dim in d.at:
            if pos >= len(values) or not isinstance(values[pos], torch.Tensor):
                return f"argument {pos} is not a tensor"
            t = values[pos]
            if dim >= t.dim():
                return f"argument {pos} has {t.dim()} dimensions, so no dimension {dim}"
            if not t.is_contiguous():
                return f"argument {pos} is not contiguous (a variable dimension needs a contiguous tensor)"
            sizes.add(t.shape[dim])
        if len(sizes) != 1:
            return f"the dimensions {d.text()} share one size but have {sorted(sizes)} in the captured call"
    return None


def _captured(d: VariableDim, values: list) -> int:
    pos, dim = d.at[0]
    return int(values[pos].shape[dim])


def _draw(t: torch.Tensor, shape: list[int], g: torch.Generator) -> torch.Tensor:
    """A contiguous tensor of ``shape`` with ``t``'s dtype and device and values like it: normal
    for floating tensors, ``t``'s range for integers, coin flips for booleans."""
    if t.is_floating_point():
        x = torch.randn(shape, generator=g, dtype=torch.float64)
    elif t.dtype == torch.bool:
        x = torch.rand(shape, generator=g) < 0.5
    else:
        lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 1)
        x = torch.randint(lo, hi + 1, shape, generator=g)
    return x.to(dtype=t.dtype, device=t.device).contiguous()


def resized_inputs(rule: ShapeRule, args: list, kwargs: dict, sizes: dict[int, int], seed: int) -> tuple[list, dict]:
    """Fresh inputs like the sample, with variable dimension ``i`` of ``rule`` at ``sizes[i]``
    (the tensors with a variable dimension redrawn at their new shape, the others kept)."""
    values = _values(args, kwargs)
    shapes: dict[int, list[int]] = {}
    for i, d in enumerate(rule.dims):
        for pos, dim in d.at:
            shapes.setdefault(pos, list(values[pos].shape))[dim] = sizes.get(i, _captured(d, values))
    g = torch.Generator().manual_seed(seed)
    new = [_draw(v, shapes[i], g) if i in shapes else v for i, v in enumerate(values)]
    return new[:len(args)], dict(zip(kwargs, new[len(args):]))


def shape_rule_cases(rule: ShapeRule, args: list, kwargs: dict) -> list[tuple[str, list, dict]]:
    """(label, args, kwargs) of each case that checks ``rule``: every variable dimension at each
    of its probe sizes, the others at their captured sizes."""
    values = _values(args, kwargs)
    cases = []
    for i, d in enumerate(rule.dims):
        for n, size in enumerate(probe_sizes(_captured(d, values))):
            a, k = resized_inputs(rule, args, kwargs, {i: size}, SEED + 31 * i + n)
            cases.append((f"shape rule: {d.text()} at size {size}", a, k))
    return cases


def checked_rule(rule: ShapeRule, args: list, kwargs: dict) -> ShapeRule:
    """``rule`` as checked: each variable dimension with its captured size and the sizes checked."""
    values = _values(args, kwargs)
    dims = []
    for d in rule.dims:
        captured = _captured(d, values)
        dims.append(d.model_copy(update={"captured": captured, "sizes": sorted({captured, *probe_sizes(captured)})}))
    return ShapeRule(dims=dims, checked=True)
