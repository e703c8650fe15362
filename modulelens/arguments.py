"""Arguments checked strictly, the same way in every front end: unknown names are refused with
the valid ones and a did-you-mean, and each field's type or value error is one line naming the
field, what was given and what is allowed (never pydantic's raw text or its links).

The front end says how a field is named (``--max-tensor-bytes`` in the CLI, ``max_tensor_bytes``
over MCP) through ``label`` and how argument markers in messages read through ``front``
(:func:`modulelens.errors.render`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from modulelens.errors import Front, render

__all__ = ["argument_errors", "did_you_mean", "parse_json_text", "unknown_names"]

Label = Callable[[str], str]
"""field name -> how the front end names it."""

_MAX_SHOWN = 60  # characters of a given value quoted back


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word`` (difflib), or None when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_names(model: type[BaseModel], given: Iterable[str], label: Label = str) -> str | None:
    """One line refusing the names in ``given`` that are not fields of ``model`` (with a
    did-you-mean and the valid names), or None when every name is known."""
    valid = list(model.model_fields)
    unknown = [name for name in given if name not in model.model_fields]
    if not unknown:
        return None
    parts = []
    for name in unknown:
        close = did_you_mean(name, valid)
        parts.append(f"{name!r}" + (f" (did you mean {label(close)}?)" if close else ""))
    noun = "argument" if len(unknown) == 1 else "arguments"
    return f"unknown {noun} {', '.join(parts)}; valid: {', '.join(label(v) for v in valid)}"


def parse_json_text(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the values of ``model``'s non-text fields that were sent as JSON text (a list,
    an object, null or a boolean written as a string, as some MCP clients do) parsed; other values
    as given (numbers in text are left to the model's own coercion)."""
    out = dict(data)
    for name, value in data.items():
        field = model.model_fields.get(name)
        if field is None or not isinstance(value, str) or field.annotation is str:
            continue
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            continue
        if not isinstance(parsed, (str, int, float)) or isinstance(parsed, bool):
            out[name] = parsed
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _allowed(err: dict[str, Any], front: Front) -> str:
    """What the field allows, from one pydantic error, in words."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in ("literal_error", "enum"):
        return f"one of {ctx.get('expected', '')}"
    if kind == "missing":
        return "a value (it is required)"
    if kind in ("value_error", "assertion_error"):
        return render(str(ctx.get("error", err["msg"])), front)
    msg = str(err["msg"])
    for prefix in ("Input should be ", "Value should be "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return render(msg[:1].lower() + msg[1:], front)


def _choices(err: dict[str, Any]) -> list[str]:
    expected = str((err.get("ctx") or {}).get("expected", ""))
    return [part.strip(" '\"") for part in expected.replace(" or ", ", ").split(",") if part.strip(" '\"")]


def _field_line(field: str, errors: list[dict[str, Any]], label: Label, front: Front) -> str:
    first = errors[0]
    where = label(field)
    same_place = len({tuple(e["loc"]) for e in errors}) == 1  # else: the members of a union
    rest = ".".join(str(p) for p in first["loc"][1:]) if same_place else ""
    if rest:
        where += f"[{rest}]" if rest.isdigit() else f".{rest}"
    if first["type"] == "missing":
        return f"{where}: required"
    allowed = "; or ".join(dict.fromkeys(_allowed(e, front) for e in errors))
    line = f"{where}: got {_shown(first.get('input'))}, expected {allowed}"
    if first["type"] in ("literal_error", "enum") and isinstance(first.get("input"), str):
        close = did_you_mean(first["input"], _choices(first))
        if close:
            line += f" (did you mean {close!r}?)"
    return line


def argument_errors(exc: ValidationError, label: Label = str, front: Front = "args") -> list[str]:
    """One line per field of ``exc`` (a request model's validation error): the field as ``label``
    names it, the value given and what is allowed. Errors of the model as a whole (a check across
    fields) come as their own lines, without a field."""
    by_field: dict[str, list[dict[str, Any]]] = {}
    whole: list[str] = []
    for err in exc.errors():
        loc = err.get("loc") or ()
        if loc:
            by_field.setdefault(str(loc[0]), []).append(dict(err))
        else:
            whole.append(_allowed(dict(err), front))
    return [_field_line(field, errors, label, front) for field, errors in by_field.items()] + whole


def loose_booleans(model: type[BaseModel], data: dict[str, Any]) -> str | None:
    """The refusal of ``data`` (after :func:`parse_json_text`) giving a boolean field of ``model``
    anything but true or false (``"yes"``, ``1``, ``"on"``, which pydantic would take as true), or
    None when there is none: an agent's yes is not a flag's value."""
    bad = [f"{name}: give true or false, not {_shown(value)}" for name, value in data.items()
           if (field := model.model_fields.get(name)) is not None and field.annotation in (bool, bool | None)
           and value is not None and not isinstance(value, bool)]
    return "; ".join(bad) or None
