"""How the CLI shows training statistics and installed skills (see :mod:`modulelens.cli.views`)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from modulelens.cli.formats import number, shape
from modulelens.cli.styles import BAD, GOOD, WARN, notes
from modulelens.cli.tables import Cell, Column, FittedTable
from modulelens.stats.runs import StatsFinding, StatsRunView, TensorStatsRow
from modulelens.tools.gather_stats import GatherStatsResult
from modulelens.tools.install_skills import InstallSkillsResult
from modulelens.tools.lists import ListStatsRunsResult

__all__ = ["STATS_VIEWS", "tensors_table"]


def _number_columns(*headers: tuple[str, int]) -> list[Column]:
    """Right-aligned optional number columns: (header, drop) each."""
    return [Column(header, "value", justify="right", drop=drop) for header, drop in headers]


def _findings_table(findings: list[StatsFinding], wide: bool) -> FittedTable:
    table = FittedTable([
        Column("kind", "key"),
        Column("module", "key"),
        Column("step", "value", justify="right", drop=0),
        Column("message", "text"),
        Column("action", "text"),
    ], title="findings", wide=wide, stack=True)
    for f in findings:
        table.add_row(Cell((f.kind,), style=BAD if f.severity == "error" else WARN), f.module or "(model)",
                      str(f.step), f.message, f.action)
    return table


def _types_table(r: GatherStatsResult, wide: bool) -> FittedTable:
    columns = [Column("type", "key"), *_number_columns(("modules", 0), ("act std", 4), ("zero frac", 3),
                                                       ("grad std", 2), ("update ratio", 1))]
    table = FittedTable(columns, title="by module type (last sampled step)", wide=wide)
    for row in r.by_type:
        table.add_row(row.type, str(row.modules), number(row.activation_std), number(row.activation_zero_frac),
                      number(row.gradient_std), number(row.update_ratio))
    return table


def tensors_table(tensors: list[TensorStatsRow], wide: bool) -> FittedTable:
    """One row per tensor of a capture's statistics (also shown by ``show capture``)."""
    columns = [Column("tensor", "key"), Column("group", "value", drop=2), Column("shape", "shrink", drop=6),
               *_number_columns(("mean", 8), ("std", 9), ("kurtosis", 3), ("zero frac", 7), ("min", 4), ("max", 5),
                                ("NaN/Inf", 1))]
    table = FittedTable(columns, title="tensors", wide=wide)
    for t in tensors:
        table.add_row(t.key, t.group, Cell((shape(t.shape),)), number(t.mean), number(t.std), number(t.kurtosis),
                      number(t.zero_frac), number(t.min), number(t.max), f"{t.nan or 0}/{t.inf or 0}")
    return table


def gather_stats_view(r: GatherStatsResult, wide: bool) -> RenderableType:
    what = (f": {r.modules} modules, {r.steps_sampled} sampled step(s) of {r.steps_seen}, order from {r.order_source}"
            if r.source == "script" else f": {len(r.tensors)} tensors of the capture")
    return _statistics(r.run_id, what, r.findings, [_types_table(r, wide)] if r.by_type else [], r.tensors, r.notes,
                       f"report: {r.report_html or '-'}", wide)


def list_stats_runs_view(r: ListStatsRunsResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("run", "key", style="cyan"),
        Column("of", "key"),
        Column("modules", "value", justify="right", drop=1),
        Column("sampled steps", "value", justify="right", drop=2),
        Column("findings", "value", justify="right"),
        Column("created", "shrink", drop=0),
    ], title=f"statistics in {r.repo}", wide=wide)
    for x in r.runs:
        table.add_row(x.run_id, x.capture or x.script or "-", str(x.modules),
                      f"{x.steps_sampled} of {x.steps_seen}" if x.kind == "run" else "-", str(x.findings),
                      Cell((x.created_at, x.created_at[:16].replace("T", " "), x.created_at[:10])) if x.created_at else "-")
    return table


def show_stats_run_view(r: StatsRunView, wide: bool) -> RenderableType:
    e = r.entry
    what = (f": {len(r.modules)} modules over {len(r.steps)} sampled step(s), order from {r.order_source}"
            if e.kind == "run" else f": {len(r.tensors)} tensors of {e.capture}")
    return _statistics(e.run_id, what, r.findings, [], r.tensors, r.notes,
                       f"report: {r.report_html or '-'} (--json for the series)", wide)


def _statistics(run_id: str, what: str, findings: list, tables: list[RenderableType], tensors: list,
                run_notes: list[str], report: str, wide: bool) -> RenderableType:
    """A statistics run as gather-stats and show-stats print it: its headline, findings (or none),
    the extra ``tables``, the tensors of a capture's statistics, notes and where the report is."""
    parts: list[RenderableType] = [Text.assemble(("statistics ", "bold"), (run_id, "bold cyan"), what)]
    parts.append(_findings_table(findings, wide) if findings else Text("no findings", style=GOOD))
    parts += tables
    if tensors:
        parts.append(tensors_table(tensors, wide))
    return Group(*parts, *notes(run_notes), Text(report))


def install_skills_view(r: InstallSkillsResult, wide: bool) -> RenderableType:
    table = FittedTable([Column("file", "key"), Column("status", "value")], title=f"skills installed in {r.target}",
                        wide=wide)
    styles = {"written": GOOD, "unchanged": "dim", "skipped": WARN}
    for status in ("written", "unchanged", "skipped"):
        for rel in getattr(r, status):
            table.add_row(rel, Cell((status,), style=styles[status]))
    return Group(table, Text("Next steps:\n" + r.next_steps))


STATS_VIEWS = {
    GatherStatsResult: gather_stats_view,
    ListStatsRunsResult: list_stats_runs_view,
    StatsRunView: show_stats_run_view,
    InstallSkillsResult: install_skills_view,
}
