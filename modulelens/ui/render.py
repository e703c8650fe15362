"""Templates and the small formatting filters the pages use.

The Jinja environment escapes every value (autoescape on, strict undefined): a template can only
insert markup that Python marked safe on purpose (:func:`~modulelens.ui.highlight.highlight`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from modulelens.ui.highlight import highlight, language_of
from modulelens.ui.sections import SECTIONS

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"


def num(x: Any, digits: int = 3) -> str:
    """A number for people: None as a dash, ints as they are, floats to ``digits`` significant."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}"


def seconds(s: float | None) -> str:
    """A duration in us, ms or s."""
    if s is None:
        return "–"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def percent(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x * 100:.{digits}f}%"


def shape(dims: list[int] | None) -> str:
    """``[8, 32, 64]`` as ``8×32×64`` (``scalar`` for no dimension)."""
    return "×".join(str(d) for d in dims) if dims else "scalar"


def rate(bytes_per_s: float | None) -> str:
    """Bytes per second in GB/s or MB/s."""
    if bytes_per_s is None:
        return "–"
    return f"{bytes_per_s / 1e9:.2f} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.1f} MB/s"


def bar_width(fraction: float | None) -> str:
    """The width attribute of an SVG bar for a fraction (clamped to 0..100%)."""
    if fraction is None or not math.isfinite(fraction):
        return "0"
    return f"{max(0.0, min(1.0, fraction)) * 100:.1f}%"


def _get(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def speedup(record: Any) -> str:
    """The speedup of a report, node or outcome (a model or its JSON) for people: its 95% interval
    when it has one (``1.42× [1.31, 1.55]``), "undetermined" with the reason when its timing was,
    else the plain figure (records from before intervals)."""
    if _get(record, "timing_status") == "undetermined":
        reason = _get(record, "timing_reason")
        return "undetermined" + (f" ({reason})" if reason else "")
    value, interval = _get(record, "speedup_vs_eager"), _get(record, "speedup_interval")
    if value is None:
        return "–"
    if isinstance(interval, (list, tuple)) and len(interval) == 2:
        return f"{num(value)}× [{num(interval[0])}, {num(interval[1])}]"
    return f"{num(value)}×"


def link(kind: str, ref: str) -> str:
    """The page of a capture, opset, candidate or statistics run."""
    return f"/{kind}/{quote(ref, safe=':@')}"


def repo_file(path: str | None, repo_root: Path) -> str | None:
    """The URL of a file inside the repository (None for a path outside it or no path)."""
    if not path:
        return None
    try:
        rel = Path(path).resolve().relative_to(repo_root.resolve())
    except ValueError:
        return None
    return "/repo/" + quote(rel.as_posix())


def make_environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=num, seconds=seconds, percent=percent, shape=shape, rate=rate, bar_width=bar_width,
                       speedup=speedup)
    env.globals.update(sections=SECTIONS, link=link, highlight=highlight, language_of=language_of)
    return env
