"""Shape rules: which dimensions of a kernel's arguments may take other sizes than the call it
was validated on.

A rule is a list of *variable dimensions*; each names the (argument position, dimension) pairs
that share one size. Positions count the entry point's arguments: the card's positional
arguments, then its keyword arguments in stored order (the candidate contract's order). A
candidate declares its rule in one comment line of its source (C++ ``//`` or Python ``#``)::

    // modulelens-variable-dims: 0.0 0.1      two independent sizes: dimensions 0 and 1 of argument 0
    # modulelens-variable-dims: 0.0=1.0       one size shared by dimension 0 of arguments 0 and 1

Everything else stays as validated: the other dimensions, the strides of tensors without a
variable dimension, every dtype, device and non-tensor argument, the number of dimensions. A
tensor with a variable dimension must be contiguous (its strides follow from its sizes).

Validation checks a declared rule on fresh inputs at sizes that were not captured
(:func:`probe_sizes`: smaller, larger, odd, 1), with the same checks and tolerances as the captured
ones, and records the rule with the sizes it checked (:class:`ShapeRule` with ``checked``); a pack
entry then admits any size from 1 to the largest size checked for each variable dimension. A
source without the line declares no rule: its entries match the validated shapes exactly.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError

DECLARATION = "modulelens-variable-dims:"
_LINE = re.compile(r"^\s*(?://|#)\s*modulelens-variable-dims:(.*)$", re.MULTILINE)
_PLACE = re.compile(r"^(\d+)\.(\d+)$")


class VariableDim(BaseModel):
    """One size that may vary: the (argument position, dimension) pairs that share it."""

    at: list[tuple[int, int]] = Field(description="(argument position, dimension) pairs sharing this size.")
    captured: int | None = Field(None, description="The size in the validated call (set by validation).")
    sizes: list[int] = Field(default_factory=list, description="Sizes checked by validation, the captured one included.")

    @property
    def max_size(self) -> int:
        """The largest size checked: calls up to it are admitted."""
        return max(self.sizes) if self.sizes else 0

    def text(self) -> str:
        return "=".join(f"{a}.{d}" for a, d in self.at)

    def place(self) -> str:
        """Where the size is, for people: ``argument 0, dim 0`` (``= argument 1, dim 0`` when shared)."""
        return " = ".join(f"argument {a}, dim {d}" for a, d in self.at)


class ShapeRule(BaseModel):
    """The variable dimensions of a candidate (see the module docstring). ``checked`` is set by
    validation once every variable dimension was checked at sizes it did not capture."""

    dims: list[VariableDim]
    checked: bool = False

    def text(self) -> str:
        """The declaration's form: ``0.0=1.0 0.1``."""
        return " ".join(d.text() for d in self.dims)

    def summary(self) -> str:
        """One line for people, each variable dimension by where it is (the argument position
        counts the kernel's arguments, see the module docstring): ``argument 0, dim 0: captured 8,
        admits 1..17; argument 0, dim 1: ...`` (``tried`` for sizes of a rule not checked)."""
        parts = []
        for d in self.dims:
            sizes = f"{'admits' if self.checked else 'tried'} {min(d.sizes)}..{d.max_size}" if d.sizes else "unchecked"
            parts.append(f"{d.place()}: captured {d.captured}, {sizes}")
        return "; ".join(parts)

    def positions(self) -> set[int]:
        """Argument positions that have a variable dimension."""
        return {a for d in self.dims for a, _ in d.at}


def parse_rule(text: str) -> ShapeRule:
    """The rule of a declaration's text (``0.0=1.0 0.1``); :class:`ModuleLensError` when malformed."""
    dims, seen = [], set()
    for group in text.split():
        at = []
        for place in group.split("="):
            m = _PLACE.match(place)
            if not m:
                raise ModuleLensError(f"malformed variable dimension {place!r} in {DECLARATION}{text}",
                                      "write ARG.DIM pairs (0.1: dimension 1 of argument 0), '=' between pairs "
                                      "that share a size, spaces between sizes")
            pair = (int(m.group(1)), int(m.group(2)))
            if pair in seen:
                raise ModuleLensError(f"{place} appears twice in {DECLARATION}{text}", "name each dimension once")
            seen.add(pair)
            at.append(pair)
        dims.append(VariableDim(at=at))
    if not dims:
        raise ModuleLensError(f"{DECLARATION} names no dimension", "e.g. // modulelens-variable-dims: 0.0 0.1")
    return ShapeRule(dims=dims)


def declared_rule(source: str) -> ShapeRule | None:
    """The rule a source declares (its first declaration line), or None."""
    m = _LINE.search(source)
    return parse_rule(m.group(1)) if m else None


def declaration(rule: ShapeRule, comment: str = "//") -> str:
    """The comment line declaring ``rule`` (what :func:`declared_rule` reads back)."""
    return f"{comment} {DECLARATION} {rule.text()}\n"


def probe_sizes(captured: int) -> list[int]:
    """Sizes a variable dimension captured at ``captured`` is checked at: 1, a smaller odd size,
    a larger odd size (``2 * captured + 1``), never the captured one, ascending."""
    smaller = max(1, captured // 2) | 1
    out = {1, 2 * captured + 1}
    if smaller < captured:
        out.add(smaller)
    out.discard(captured)
    return sorted(out)
