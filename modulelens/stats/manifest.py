"""The manifest of a ``stats`` artifact: where the statistics come from and a summary of them.

Every reader of a stored statistics run goes through :class:`StatsManifest` (:func:`stats_manifest`);
nothing reads the stored JSON by string key. Fields added later have defaults, so runs written by
earlier versions load. The per-step series and the findings are files of the artifact
(``series.json``, ``findings.json``), not manifest fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from modulelens.repo import Artifact, ManifestBase

KIND = "stats"


class TypeRow(BaseModel):
    """Aggregates over the modules of one type at the last sampled step (means over modules)."""

    type: str
    modules: int
    activation_std: float | None = None
    activation_zero_frac: float | None = None
    activation_kurtosis: float | None = None
    gradient_std: float | None = None
    update_ratio: float | None = None
    nonfinite: int = 0


class StatsSource(BaseModel):
    """How the statistics were produced: a script run by gather-stats, the Python API, or a capture."""

    model_config = ConfigDict(extra="allow")

    kind: str = "api"
    script: str | None = None
    argv: list[str] = Field(default_factory=list)
    cwd: str | None = None
    capture: str | None = None
    every: int | None = None
    steps: int | None = None


class StatsSummary(BaseModel):
    """What a reader needs without opening the series."""

    kind: Literal["run", "capture"] = "run"
    modules: int = 0
    steps_seen: int = 0
    steps_sampled: int = 0
    sampled_steps: list[int] = Field(default_factory=list, description="the first 50")
    every: int | None = None
    order_source: Literal["fx", "observed", "capture"] = "capture"
    findings: int = 0
    compiled: bool = False
    notes: list[str] = Field(default_factory=list)
    by_type: list[TypeRow] = Field(default_factory=list)
    by_type_step: int | None = Field(None, description="the step of by_type: the last sampled one with finite values")
    report_files: list[str] = Field(default_factory=list)
    capture: str | None = None
    tensors: int | None = None


class StatsManifest(ManifestBase):
    source: StatsSource = Field(default_factory=StatsSource)
    summary: StatsSummary = Field(default_factory=StatsSummary)


def stats_manifest(artifact: Artifact) -> StatsManifest:
    """The typed manifest of a ``stats`` artifact."""
    return artifact.manifest_as(StatsManifest)
