"""Rich tables for the CLI's human view of a tool's result (``Tool.render``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def rows_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Any:
    """A rich ``Table`` titled ``title`` with one row per item of ``rows``; every cell is shown as
    escaped text (None as '-', floats to 3 significant digits)."""
    from rich.markup import escape
    from rich.table import Table

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        return escape(f"{value:.3g}" if isinstance(value, float) else str(value))

    table = Table(title=escape(title), title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(cell(v) for v in row))
    return table
