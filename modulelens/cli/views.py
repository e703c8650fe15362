"""How the CLI shows each tool's result to a person, keyed by the result model.

Every table goes through :class:`~modulelens.cli.tables.FittedTable`, so ids, references and
operator names are never cut at any terminal width (``--wide`` shows every column in full). A
result model without a view here falls back to the tool's own ``render`` or to
:func:`generic_view` (one row per field). The views themselves live by domain:
:mod:`~modulelens.cli.capture_views` (captures, cards, profiles), :mod:`~modulelens.cli.kernel_views`
(kernels, validation, searches, packs, runs), :mod:`~modulelens.cli.stats_views` (statistics,
skills) and :mod:`~modulelens.cli.repo_views` (what only ``list`` and ``show`` return); their
colours and shared cells in :mod:`~modulelens.cli.styles`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from rich.console import Group, RenderableType
from rich.text import Text

from modulelens.cli.capture_views import CAPTURE_VIEWS
from modulelens.cli.kernel_views import KERNEL_VIEWS
from modulelens.cli.repo_views import REPO_VIEWS
from modulelens.cli.stats_views import STATS_VIEWS
from modulelens.cli.tables import Cell, Column, FittedTable, kv_table

__all__ = ["View", "generic_view", "left_out_notes", "view_for"]

View = Callable[[Any, bool], RenderableType]  # (result, wide) -> what to print

_VIEWS: dict[type[BaseModel], View] = {**CAPTURE_VIEWS, **KERNEL_VIEWS, **STATS_VIEWS, **REPO_VIEWS}


def view_for(result_type: type[BaseModel]) -> View | None:
    """The view of this result model, or of the nearest base model that has one."""
    for cls in result_type.__mro__:
        if cls in _VIEWS:
            return _VIEWS[cls]
    return None


# Result fields cut by a request field of their own; any other list is cut by ``top`` or ``limit``,
# except those a reply always cuts to a fixed size (no option shows more: the stored file has them).
_CUT_BY = {"steps": "points", "source": "source_lines"}
_FIXED_CUT = frozenset({"edge_cases", "wrapper_evidence", "detail"})


def _cut_option(field: str, request: type[BaseModel]) -> str | None:
    """The option of ``request`` that decides how much of the result list ``field`` is shown (None:
    none does)."""
    if field.rsplit(".", 1)[-1] in _FIXED_CUT:
        return None
    names = [_CUT_BY.get(field.rsplit(".", 1)[-1], ""), "top", "limit"]
    name = next((n for n in names if n in request.model_fields), None)
    return None if name is None else "--" + name.replace("_", "-")


def left_out_notes(result: BaseModel, request: type[BaseModel]) -> list[RenderableType]:
    """One line under the tables for each list ``result`` cut short (its ``left_out``): how many
    items were not shown, the option of ``request`` that shows more, and where the full data is."""
    notes: list[RenderableType] = []
    for cut in getattr(result, "left_out", None) or []:
        option = _cut_option(cut.field, request)
        where = f"{option} N to see more; full data: {cut.full}" if option else f"the stored file lists them: {cut.full}"
        notes.append(Text(f"{cut.total - cut.shown} more {cut.field} not shown ({where})", style="dim"))
    return notes


def _value_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float, bool)) or v is None for v in value):
        return ", ".join("-" if v is None else str(v) for v in value) or "[]"
    return json.dumps(value, separators=(",", ":"), default=str)


def _records_table(name: str, records: list[dict[str, Any]], wide: bool) -> FittedTable:
    keys: list[str] = []
    for row in records:
        keys.extend(k for k in row if k not in keys)
    table = FittedTable([Column(k, "text") for k in keys], title=name, wide=wide)
    for row in records:
        table.add_row(*(_value_cell(row.get(k)) for k in keys))
    return table


def generic_view(result: BaseModel, wide: bool) -> RenderableType:
    """One row per field; lists of records as their own tables below (``left_out`` is said by
    :func:`left_out_notes`)."""
    rows: list[tuple[str, str | Cell]] = []
    tables: list[RenderableType] = []
    for name, value in result.model_dump(mode="json", exclude={"left_out", "warnings", "next"}).items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.append(_records_table(name, value, wide))
        else:
            rows.append((name, _value_cell(value)))
    return Group(kv_table(rows), *tables)
