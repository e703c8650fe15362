"""How the CLI shows the listings and records that only ``list`` and ``show`` return: searches,
stored packs, validation reports (the other kinds reuse the views in :mod:`modulelens.cli.views`)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from modulelens.cli.tables import Cell, Column, FittedTable, kv_table
from modulelens.tools.lists import ListPacksResult, ListReportsResult, ListSearchesResult
from modulelens.tools.show import ShowPackResult, ShowReportResult

__all__ = ["REPO_VIEWS"]

_STYLE = {"custom": "green", "wrapper": "yellow", "rejected": "red"}


def _speedup(x: float | None) -> str:
    return f"{x:.2f}x" if x is not None else "-"


def list_searches_view(r: ListSearchesResult, wide: bool) -> RenderableType:
    table = FittedTable([Column("search", "key", style="cyan"), Column("targets", "key"),
                         Column("best", "value"), Column("runs", "value", justify="right", drop=1),
                         Column("provider", "value", drop=0)], title=f"searches in {r.repo}", wide=wide)
    for s in r.searches:
        best = ", ".join(f"{o.target}: {_speedup(o.speedup_vs_eager)}" for o in s.best if o.best_candidate) or "-"
        table.add_row(s.search_id, ", ".join(s.targets), best, str(s.runs), f"{s.provider}/{s.backend}")
    return table


def list_packs_view(r: ListPacksResult, wide: bool) -> RenderableType:
    table = FittedTable([Column("pack", "key", style="cyan"), Column("used", "value", justify="right"),
                         Column("trusted", "value"), Column("file", "key", drop=0)], title=f"stored packs in {r.repo}",
                        wide=wide)
    for p in r.packs:
        table.add_row(p.ref, f"{p.dispatched}/{p.entries}", Cell(("yes" if p.trusted else "no",),
                      style="green" if p.trusted else "yellow"), p.path)
    return table


def list_reports_view(r: ListReportsResult, wide: bool) -> RenderableType:
    table = FittedTable([Column("report", "key", style="cyan"), Column("candidate", "key"),
                         Column("verdict", "value"), Column("speedup", "value", justify="right")],
                        title=f"validation reports in {r.repo}", wide=wide)
    for e in r.reports:
        table.add_row(e.report, e.candidate, Cell((e.verdict,), style=_STYLE.get(e.verdict, "")),
                      _speedup(e.speedup_vs_eager))
    return table


def show_pack_view(r: ShowPackResult, wide: bool) -> RenderableType:
    head = kv_table([("file", r.path), ("sha256", r.sha256), ("trusted", "yes" if r.trusted else "no"),
                     ("environment", f"torch {r.environment.torch}, {r.environment.device_name}")], title=f"pack {r.ref}")
    table = FittedTable([Column("candidate", "key", style="cyan"), Column("target", "key"),
                         Column("verdict", "value"), Column("speedup", "value", justify="right"),
                         Column("used", "value")], wide=wide)
    for e in r.entries:
        table.add_row(e.candidate_id, e.target, Cell((e.verdict,), style=_STYLE.get(e.verdict, "")),
                      _speedup(e.speedup_vs_eager), "yes" if e.dispatched else "no")
    return Group(head, table)


def show_report_view(r: ShowReportResult, wide: bool) -> RenderableType:
    rows: list[tuple[str, str | Cell]] = [("verdict", Cell((f"{r.verdict}: {r.reason}",), style=_STYLE[r.verdict])),
                                          ("stage", r.stage), ("speedup", f"{_speedup(r.speedup_vs_eager)} vs eager")]
    failed = [c for c in r.checks if not c.passed]
    parts: list[RenderableType] = [kv_table(rows, title=f"report {r.ref} ({r.backend})")]
    parts += [Text(f"failed: {c.name}: {c.detail}", style="red") for c in failed]
    return Group(*parts)


REPO_VIEWS = {
    ListSearchesResult: list_searches_view,
    ListPacksResult: list_packs_view,
    ListReportsResult: list_reports_view,
    ShowPackResult: show_pack_view,
    ShowReportResult: show_report_view,
}
