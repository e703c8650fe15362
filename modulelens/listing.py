"""Long lists in results, cut to a size an agent can read: the first ``top`` items are kept, and
the result says how many were left out and where the full data is (a file, a resource)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

__all__ = ["MAX_ITEMS", "MAX_REPLY_CHARS", "LeftOut", "everything", "keep_first", "keep_first_each"]

MAX_REPLY_CHARS = 8_000
"""The most characters of one reply or resource (its compact JSON, what an agent reads): what is
longer is cut, and its ``left_out`` says what was cut and where the whole is."""

MAX_ITEMS = 100
"""The most items a reply lists from one list (the maximum of every ``top`` and ``limit``): a
larger value is refused when the request is checked. The stored files have every item."""


class LeftOut(BaseModel):
    """One list a result cut short."""

    field: str = Field(description="The result field that was cut.")
    shown: int
    total: int
    full: str = Field(description="Where the whole list is: a file path or a modulelens:// resource.")


M = TypeVar("M", bound=BaseModel)

# Request fields that cut a reply short (set to their maximum for the whole data), and detail flags.
_CUTS = ("top", "limit", "points")
_DETAIL = {"full": True}


def _maximum(field: FieldInfo) -> int | None:
    for constraint in field.metadata:
        if isinstance(getattr(constraint, "le", None), int):
            return constraint.le
    return None


def everything(request: type[BaseModel]) -> dict[str, object]:
    """The request fields of ``request`` that cut a reply short, set to show as much as they allow:
    ``top``, ``limit`` and ``points`` at their maximum, detail flags on."""
    fields = request.model_fields
    out: dict[str, object] = {name: _maximum(fields[name]) for name in _CUTS if name in fields}
    out = {name: value for name, value in out.items() if value is not None}
    return out | {name: value for name, value in _DETAIL.items() if name in fields}


def keep_first(result: M, field: str, top: int | None, full: str) -> M:
    """``result`` with at most ``top`` items (None: all) of its list ``field``; when items are
    dropped, a :class:`LeftOut` naming ``full`` is appended to ``result.left_out``."""
    items = getattr(result, field)
    if top is None or len(items) <= top:
        return result
    left_out = [*result.left_out, LeftOut(field=field, shown=top, total=len(items), full=full)]
    return result.model_copy(update={field: items[:top], "left_out": left_out})


def keep_first_each(result: M, field: str, inner: str, limit: int | None, full: Callable[[int, Any], str]) -> M:
    """``result`` with about ``limit`` items (None: all) of the lists ``inner`` of the records in
    its list ``field``, shared among them: each record keeps its first ``max(1, limit // records)``.
    Each cut list is appended to ``result.left_out`` as ``{field}.{i}.{inner}``, its whole data
    being ``full(i, record)``."""
    records = getattr(result, field)
    if limit is None or not records:
        return result
    each = max(1, limit // len(records))
    kept, left_out = [], list(result.left_out)
    for i, record in enumerate(records):
        items = getattr(record, inner)
        if len(items) > each:
            left_out.append(LeftOut(field=f"{field}.{i}.{inner}", shown=each, total=len(items), full=full(i, record)))
            record = record.model_copy(update={inner: items[:each]})
        kept.append(record)
    return result.model_copy(update={field: kept, "left_out": left_out})
