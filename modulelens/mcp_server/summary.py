"""The text content of a tool result: a short line for a person, not a second copy of the
structured result (which carries every field)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_MAX_VALUE = 60  # characters of one value in the line
_MAX_LINE = 400


def _short(value: Any) -> str | None:
    """A scalar as the summary shows it, None for what it leaves out (nested data, long text)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (int, str)):
        text = str(value)
        return text if text and "\n" not in text and len(text) <= _MAX_VALUE else None
    return None


def result_summary(tool_name: str, result: BaseModel) -> str:
    """``tool_name`` and the result's short scalar fields and list lengths on one line, e.g.
    ``replay_module: ref=blk:v1, strategy=source, match=yes, ..., outputs: 1 item``; the full
    result is the structured content."""
    parts: list[str] = []
    for name, value in result:
        if isinstance(value, list):
            parts.append(f"{name}: {len(value)} item{'' if len(value) == 1 else 's'}")
        elif (shown := _short(value)) is not None:
            parts.append(f"{name}={shown}")
    line = f"{tool_name}: " + ", ".join(parts)
    if len(line) > _MAX_LINE:
        line = line[: _MAX_LINE - 3] + "..."
    return line + " (full result in the structured content)"
