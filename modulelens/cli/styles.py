"""The colours the CLI's views share, and the cells and lines built with them."""

from __future__ import annotations

from rich.text import Text

from modulelens.cli.tables import Cell

__all__ = ["BAD", "GOOD", "VERDICT_STYLE", "WARN", "notes", "verdict_cell", "yes_no"]

GOOD, BAD, WARN = "green", "red", "yellow"
VERDICT_STYLE = {"custom": GOOD, "wrapper": WARN, "rejected": BAD}
"""A validation verdict's colour."""


def yes_no(ok: bool) -> Cell:
    return Cell(("yes" if ok else "no",), style=GOOD if ok else BAD)


def verdict_cell(verdict: str | None) -> Cell:
    """A verdict in its colour, or ``not validated``."""
    return Cell((verdict,), style=VERDICT_STYLE.get(verdict, "")) if verdict else Cell(("not validated",), style="dim")


def notes(lines: list[str], label: str = "note") -> list[Text]:
    """One warning-coloured line per note: ``note: ...``."""
    return [Text(f"{label}: {line}", style=WARN) for line in lines]
