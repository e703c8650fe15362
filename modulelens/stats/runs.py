"""Read-only views of the stored statistics runs (the MCP resources ``modulelens://stats`` and
``modulelens://stats/{ref}``): the list of runs, and one run's summary and findings."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from modulelens.repo import Repository
from modulelens.stats.manifest import KIND, StatsSource, StatsSummary, stats_manifest


class StatsRunEntry(BaseModel):
    ref: str = Field(description="name:vN of the stats artifact")
    created_at: str = ""
    kind: str = Field("run", description="run (a training run) or capture (the tensors of a capture)")
    modules: int = 0
    steps_sampled: int = 0
    findings: int = 0


class StatsRunList(BaseModel):
    runs: list[StatsRunEntry] = Field(default_factory=list, description="every version of every run, newest first")


class StatsRunView(BaseModel):
    ref: str
    created_at: str = ""
    source: StatsSource
    summary: StatsSummary
    findings: list[dict[str, Any]] = Field(default_factory=list, description="findings.json")
    report_html: str | None = Field(None, description="path of the self-contained HTML report")
    series_file: str = Field("", description="path of series.json (raw and EMA series per module)")


def list_runs(repo: Repository) -> StatsRunList:
    """Every stored statistics run of ``repo``, newest first."""
    entries = []
    for name in repo.names(KIND):
        for version in repo.versions(KIND, name):
            art = repo.open(KIND, f"{name}:v{version}")
            m = stats_manifest(art)
            entries.append(StatsRunEntry(
                ref=art.ref, created_at=m.created_at, kind=m.summary.kind, modules=m.summary.modules,
                steps_sampled=m.summary.steps_sampled, findings=m.summary.findings,
            ))
    entries.sort(key=lambda e: e.created_at, reverse=True)
    return StatsRunList(runs=entries)


def show_run(repo: Repository, ref: str) -> StatsRunView:
    """One run (``name``, ``name:vN`` or ``name@tag``): its manifest, findings and file paths."""
    art = repo.open(KIND, ref)
    m = stats_manifest(art)
    return StatsRunView(
        ref=art.ref, created_at=m.created_at, source=m.source, summary=m.summary,
        findings=art.read_json("findings.json"),
        report_html=str(art.file("report.html")) if "report.html" in m.summary.report_files else None,
        series_file=str(art.file("series.json")),
    )
