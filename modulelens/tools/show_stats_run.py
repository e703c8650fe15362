"""show_stats_run: one stored statistics run: findings and the per-module and per-type series."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from modulelens.listing import keep_first
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.stats.runs import StatsRunView, stats_view, thin_steps


class ShowStatsRunRequest(BaseModel):
    run: str = Field(description="Statistics ref.",
                     json_schema_extra={"cli": "argument"})
    stats: list[str] = Field(default_factory=lambda: ["std", "zero_frac", "mean", "rms", "kurtosis"],
                             description="Of: count, mean, std, skew, kurtosis, zero_frac, min, max, nan, inf, kl_gauss, rms, gain, input_rms.")
    top: int | None = Field(3, ge=1, description="Modules, types and tensors shown (null: all).")
    points: int | None = Field(8, ge=1, description="Steps per series, evenly spaced (null: all).")
    definitions: bool = Field(False, description="Also define each statistic.")


def show_stats_run(req: ShowStatsRunRequest, ctx: ToolContext) -> StatsRunView:
    view = stats_view(Repository(ctx.repo_root), req.run, req.stats)
    series = str(Path(view.path) / "series.json")
    for field in ("modules", "types", "tensors"):
        view = keep_first(view, field, req.top, series)
    if not req.definitions:
        view = view.model_copy(update={"definitions": {}})
    return thin_steps(view, req.points)


TOOL = register(
    Tool(
        name="show_stats_run",
        request=ShowStatsRunRequest,
        result=StatsRunView,
        fn=show_stats_run,
        summary="Show a statistics run: findings and series per module and type.",
    )
)
