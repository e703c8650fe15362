"""Short text forms of the values the CLI's tables show (shapes, dtypes, times, shares).

Pure functions; :class:`~modulelens.cli.tables.Cell` forms are built from them (longest first).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from modulelens.cli.tables import ELLIPSIS, Cell

__all__ = ["dtype_short", "dtypes_cell", "elided", "list_cell", "number", "percent", "seconds", "shape", "shapes_cell",
           "speedup"]

_DTYPE_PREFIXES = (("bfloat", "bf"), ("float", "f"), ("uint", "u"), ("int", "i"), ("complex", "c"))


def shape(dims: Sequence[int] | None) -> str:
    """``[16,64,128]``: a tensor shape without spaces (``[]`` for a scalar, ``-`` when unknown)."""
    return "-" if dims is None else "[" + ",".join(str(d) for d in dims) + "]"


def elided(parts: Sequence[str], sep: str = " ") -> tuple[str, ...]:
    """The forms of a list, longest first: all of it, then fewer and fewer leading items and ``…``."""
    if not parts:
        return ("-",)
    forms = [sep.join(parts)]
    forms += [sep.join(parts[:k]) + f"{sep}{ELLIPSIS}" for k in range(len(parts) - 1, 0, -1)]
    return tuple(forms)


def list_cell(parts: Sequence[str], sep: str = " ", style: str = "") -> Cell:
    return Cell(elided(parts, sep), style=style)


def shapes_cell(shapes: Sequence[Sequence[int] | None]) -> Cell:
    """``[8,32,64] [64] [64]``, shortened to ``[8,32,64] [64] …`` and so on."""
    return list_cell([shape(s) for s in shapes])


def dtype_short(dtype: str) -> str:
    """``float32`` -> ``f32``, ``bfloat16`` -> ``bf16``, ``int64`` -> ``i64``; others unchanged."""
    name = dtype.removeprefix("torch.")
    for long, short in _DTYPE_PREFIXES:
        if re.fullmatch(rf"{long}\d+", name):
            return short + name[len(long):]
    return name


def dtypes_cell(dtypes: Sequence[str]) -> Cell:
    """The distinct dtypes in order: ``float32,int64``, shortened to ``f32,i64``."""
    distinct = list(dict.fromkeys(dtypes))
    if not distinct:
        return Cell(("-",))
    return Cell((",".join(distinct), ",".join(dtype_short(d) for d in distinct)))


def seconds(s: float | None) -> str:
    """``12.34 us``, ``1.234 ms``, ``2.345 s`` (``-`` for None)."""
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


def speedup(x: float | None) -> str:
    """``1.25x``, or ``-`` when unknown."""
    return f"{x:.2f}x" if x is not None else "-"


def percent(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def number(x: float | None) -> str:
    """Three significant digits (``-`` for None)."""
    return "-" if x is None else f"{x:.3g}"


# C0 controls except tab and newline, DEL and C1 controls: written as visible escapes (``\x1b``),
# so text from a capture, a script or a candidate cannot move the cursor, retitle the terminal or
# hide what follows it.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, *range(0x80, 0xA0))}


def printable(text: str) -> str:
    """``text`` with terminal control characters made visible (see ``_CONTROL``)."""
    return text.translate(_CONTROL)


def printable_value(value: Any) -> Any:
    """A result (pydantic model, list, dict, str) with :func:`printable` applied to every string."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, BaseModel):
        return value.model_copy(update={name: printable_value(getattr(value, name)) for name in type(value).model_fields})
    if isinstance(value, list):
        return [printable_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(printable_value(v) for v in value)
    if isinstance(value, dict):
        return {printable_value(k): printable_value(v) for k, v in value.items()}
    return value
