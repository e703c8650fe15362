"""Read-only views of the statistics in a repository: one row per stored run, and one run's
findings and series (the numbers behind the report's plots), chosen statistics only.

:class:`~modulelens.stats.manifest.StatsManifest` is the typed ``stats`` manifest these views read;
unknown fields are kept, so any run written so far loads. Series columns are aligned with ``steps`` and hold None where a module was not called or a
value is undefined (see :mod:`modulelens.stats.series`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from modulelens.capture import KIND as CAPTURES
from modulelens.listing import LeftOut
from modulelens.replies import ToolReply
from modulelens.repo import Artifact, Repository
from modulelens.stats.artifact import capture_series
from modulelens.stats.manifest import KIND, stats_manifest
from modulelens.stats.schema import CaptureSeries, RunSeries, StatsFinding, read_findings, read_series

__all__ = ["StatsFinding", "StatsRunEntry", "StatsRunView", "TensorStatsRow", "stats_entries", "stats_view", "thin_steps"]

Column = list[float | None]


class StatsRunEntry(BaseModel):
    run_id: str = Field(description="name:vN of the stored statistics.")
    name: str
    version: int
    kind: Literal["run", "capture"] = Field(description="run: a training script; capture: a capture's tensors.")
    script: str | None = None
    argv: list[str] = Field(default_factory=list)
    capture: str | None = None
    modules: int
    steps_seen: int
    steps_sampled: int
    every: int | None = None
    findings: int
    created_at: str


def _entry(art: Artifact) -> StatsRunEntry:
    m = stats_manifest(art)
    s = m.summary
    return StatsRunEntry(
        run_id=art.ref, name=art.name, version=art.version, kind=s.kind, script=m.source.script,
        argv=m.source.argv, capture=m.source.capture, modules=s.modules, steps_seen=s.steps_seen,
        steps_sampled=s.steps_sampled, every=s.every, findings=s.findings, created_at=m.created_at,
    )


def stats_entries(repo: Repository, name: str | None = None) -> list[StatsRunEntry]:
    """Every stored statistics version, by name then version; only the versions of ``name`` when
    given (none when nothing has that name)."""
    names = [n for n in repo.names(KIND) if name is None or n == name]
    return [_entry(repo.open(KIND, f"{n}:v{version}")) for n in names for version in repo.versions(KIND, n)]


class TensorStatsRow(BaseModel):
    """The statistics of one tensor of a capture (what gather_stats and show, of a capture
    or a statistics run, return for it)."""

    key: str = Field(description="args.0, output, a parameter name, grad.<key>.")
    group: Literal["input", "output", "weight", "gradient"]
    shape: list[int] = Field(default_factory=list)
    dtype: str = ""
    stored: bool = Field(True, description="False: stored shape-only; statistics from the capture's summary.")
    mean: float | None = None
    std: float | None = None
    rms: float | None = None
    skew: float | None = None
    kurtosis: float | None = None
    zero_frac: float | None = None
    min: float | None = None
    max: float | None = None
    nan: int | None = None
    inf: int | None = None
    kl_gauss: float | None = None
    sampled: bool | None = Field(None, description="True: mean/std/skew/kurtosis/KL estimated from a sample.")


def tensor_rows(series: CaptureSeries | RunSeries) -> list[TensorStatsRow]:
    """One row per tensor of a capture's statistics (:func:`~modulelens.stats.artifact.capture_series`);
    none for a training run."""
    if not isinstance(series, CaptureSeries):
        return []
    stat_fields = set(TensorStatsRow.model_fields) - {"key", "group", "shape", "dtype", "stored"}
    return [TensorStatsRow(key=key, group=t.group, shape=t.shape, dtype=t.dtype, stored=t.stored,
                           **{k: v for k, v in t.stats.items() if k in stat_fields})
            for key, t in series.tensors.items()]


def capture_tensor_rows(repo: Repository, ref: str) -> tuple[Artifact, list[TensorStatsRow], list[str]]:
    """Statistics of every tensor a capture holds, computed now and stored nowhere: the capture,
    its rows and the notes (shape-only tensors)."""
    art = repo.open(CAPTURES, ref)
    series = capture_series(art)
    return art, tensor_rows(series), list(series.notes)


class ModuleSeries(BaseModel):
    name: str
    type: str = ""
    index: int = Field(description="Position in execution order.")
    activation: dict[str, Column] = Field(default_factory=dict, description="Statistics of the module's output.")
    gradient: dict[str, Column] = Field(default_factory=dict, description="Statistics of the gradient at its output.")
    softmax: dict[str, Column] = Field(default_factory=dict, description="Of the softmax it computes (entropy, "
                                       "max_prob, onehot_frac).")


class TypeSeries(BaseModel):
    type: str
    modules: list[str]
    activation: dict[str, Column] = Field(default_factory=dict)
    gradient: dict[str, Column] = Field(default_factory=dict)
    update_ratio: Column = Field(default_factory=list)


class StatsRunView(ToolReply):
    entry: StatsRunEntry
    steps: list[int] = Field(default_factory=list)
    order_source: str = ""
    modules: list[ModuleSeries] = Field(default_factory=list, description="In execution order.")
    types: list[TypeSeries] = Field(default_factory=list)
    findings: list[StatsFinding] = Field(default_factory=list)
    tensors: list[TensorStatsRow] = Field(default_factory=list, description="A capture's statistics: its tensors.")
    definitions: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    report_html: str | None = None
    report_png: str | None = None
    path: str = ""
    left_out: list[LeftOut] = Field(default_factory=list, description="Lists cut to `top` items.")


def _evenly(count: int, points: int) -> list[int]:
    """At most ``points`` indices of ``range(count)``, evenly spaced, first and last included."""
    if count <= points:
        return list(range(count))
    if points == 1:
        return [count - 1]
    return sorted({round(i * (count - 1) / (points - 1)) for i in range(points)})


def thin_steps(view: StatsRunView, points: int | None) -> StatsRunView:
    """``view`` with every series cut to at most ``points`` sampled steps, evenly spaced (first and
    last kept); ``steps`` lists the steps kept. None keeps every step."""
    if points is None or len(view.steps) <= points:
        return view
    keep = _evenly(len(view.steps), points)

    def thin(columns: dict[str, Column]) -> dict[str, Column]:
        return {name: [col[i] for i in keep if i < len(col)] for name, col in columns.items()}

    modules = [m.model_copy(update={"activation": thin(m.activation), "gradient": thin(m.gradient),
                                    "softmax": thin(m.softmax)})
               for m in view.modules]
    types = [t.model_copy(update={"activation": thin(t.activation), "gradient": thin(t.gradient),
                                  "update_ratio": [t.update_ratio[i] for i in keep if i < len(t.update_ratio)]})
             for t in view.types]
    left_out = [*view.left_out, LeftOut(field="steps", shown=len(keep), total=len(view.steps),
                                        full=str(Path(view.path) / "series.json"))]
    return view.model_copy(update={"steps": [view.steps[i] for i in keep], "modules": modules, "types": types,
                                   "left_out": left_out})


def _pick(columns: dict[str, Any], stats: Sequence[str]) -> dict[str, Column]:
    return {s: columns[s] for s in stats if s in columns}


def stats_view(repo: Repository, ref: str, stats: Sequence[str]) -> StatsRunView:
    """One stored run: its row, findings, notes, report files and the series of ``stats`` (names
    from :data:`modulelens.stats.stats.STAT_NAMES` plus gain, input_rms and sat_frac; softmax
    ``entropy``, ``max_prob`` and ``onehot_frac``) per module and type."""
    art = repo.open(KIND, ref)
    m = stats_manifest(art)
    series = read_series(art)
    files = m.summary.report_files
    run = series if isinstance(series, RunSeries) else RunSeries()
    modules = [ModuleSeries(name=name, type=info.type, index=info.index,
                            activation=_pick(info.activation, stats), gradient=_pick(info.gradient, stats),
                            softmax=_pick(info.softmax, stats))
               for name, info in run.modules.items()]
    types = [TypeSeries(type=t, modules=info.modules, activation=_pick(info.activation, stats),
                        gradient=_pick(info.gradient, stats), update_ratio=info.update_ratio)
             for t, info in sorted(run.types.items())]
    return StatsRunView(
        entry=_entry(art), steps=run.steps, order_source=m.summary.order_source,
        modules=sorted(modules, key=lambda x: x.index), types=types, findings=read_findings(art),
        tensors=tensor_rows(series), definitions=series.definitions, notes=m.summary.notes,
        report_html=str(art.file("report.html")) if "report.html" in files else None,
        report_png=str(art.file("report.png")) if "report.png" in files else None, path=str(art.path),
    )
