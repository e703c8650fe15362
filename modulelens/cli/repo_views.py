"""How the CLI shows the listings and records that only ``list`` and ``show`` return: searches,
stored packs, validation reports (the other kinds reuse the views in :mod:`modulelens.cli.views`)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from modulelens.cli.formats import speedup
from modulelens.cli.styles import VERDICT_STYLE
from modulelens.cli.tables import Cell, Column, FittedTable, kv_table
from modulelens.tools.lists import ListPacksResult, ListReportsResult, ListSearchesResult
from modulelens.tools.show import ShowPackResult, ShowReportResult

__all__ = ["REPO_VIEWS"]

def list_searches_view(r: ListSearchesResult, wide: bool) -> RenderableType:
    table = FittedTable([Column("search", "key", style="cyan"), Column("targets", "key"),
                         Column("best", "value"), Column("runs", "value", justify="right", drop=1),
                         Column("provider", "value", drop=0)], title=f"searches in {r.repo}", wide=wide)
    for s in r.searches:
        best = ", ".join(f"{o.target}: {speedup(o.speedup_vs_eager)}" for o in s.best if o.best_candidate) or "-"
        table.add_row(s.search_id, ", ".join(s.targets), best, str(s.runs), f"{s.provider}/{s.backend}")
    return table


def list_packs_view(r: ListPacksResult, wide: bool) -> RenderableType:
    table = FittedTable([Column("pack", "key", style="cyan"), Column("used", "value", justify="right"),
                         Column("rules", "value", justify="right", drop=3), Column("trusted", "value", drop=2),
                         Column("last run", "text", drop=1), Column("last check", "text", drop=0)],
                        title=f"stored packs in {r.repo}", wide=wide)
    for p in r.packs:
        check = "-" if p.last_check is None else f"{'ok' if p.last_check.ok else 'NOT OK'}: {p.last_check.summary}"
        table.add_row(p.ref, f"{p.dispatched}/{p.entries}", str(p.shape_rules), Cell(("yes" if p.trusted else "no",),
                      style="green" if p.trusted else "yellow"), p.last_run.summary if p.last_run else "-", check)
    return table


def list_reports_view(r: ListReportsResult, wide: bool) -> RenderableType:
    table = FittedTable([Column("report", "key", style="cyan"), Column("candidate", "key"),
                         Column("verdict", "value"), Column("speedup", "value", justify="right")],
                        title=f"validation reports in {r.repo}", wide=wide)
    for e in r.reports:
        table.add_row(e.report, e.candidate, Cell((e.verdict,), style=VERDICT_STYLE.get(e.verdict, "")),
                      speedup(e.speedup_vs_eager))
    return table


def show_pack_view(r: ShowPackResult, wide: bool) -> RenderableType:
    head = kv_table([("file", r.path), ("sha256", r.sha256), ("trusted", "yes" if r.trusted else "no"),
                     ("environment", f"torch {r.environment.torch}, {r.environment.device_name}")], title=f"pack {r.ref}")
    table = FittedTable([Column("candidate", "key", style="cyan"), Column("target", "key"),
                         Column("phase", "value", drop=3), Column("verdict", "value", drop=2),
                         Column("speedup", "value", justify="right"), Column("shapes", "text"),
                         Column("used", "value"), Column("run hits", "value", drop=1),
                         Column("check hits", "value", justify="right", drop=0)], wide=wide,
                        stack=True)  # a shape rule on its own line rather than folded in a narrow column
    for e in r.entries:
        run = "-" if e.run_hits is None else " ".join(f"{k} {n}" for k, n in e.run_hits.items()) or "0"
        table.add_row(e.candidate_id, e.target, e.phase, Cell((e.verdict,), style=VERDICT_STYLE.get(e.verdict, "")),
                      speedup(e.speedup_vs_eager), e.shape_rule or "exact", "yes" if e.dispatched else "no", run,
                      "-" if e.check_hits is None else str(e.check_hits))
    uses = [Text(f"last {what}: {u.summary} ({u.subject})") for what, u in (("run", r.last_run), ("check", r.last_check))
            if u is not None]
    return Group(head, table, *uses)


def show_report_view(r: ShowReportResult, wide: bool) -> RenderableType:
    rows: list[tuple[str, str | Cell]] = [("verdict", Cell((f"{r.verdict}: {r.reason}",), style=VERDICT_STYLE[r.verdict])),
                                          ("stage", r.stage), ("speedup", f"{speedup(r.speedup_vs_eager)} vs eager")]
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
