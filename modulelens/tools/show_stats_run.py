"""show_stats_run: one stored statistics run: findings and the per-module and per-type series."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.stats.runs import StatsRunView, stats_view


class ShowStatsRunRequest(BaseModel):
    run: str = Field(description="Statistics reference (name, name:v2, name@tag), as gather-stats returned.",
                     json_schema_extra={"cli": "argument"})
    stats: list[str] = Field(default_factory=lambda: ["std", "zero_frac", "mean", "rms", "kurtosis"],
                             description="Which statistics to return per module and type (count, mean, std, skew, "
                             "kurtosis, zero_frac, min, max, nan, inf, kl_gauss, rms, gain, input_rms).")


def show_stats_run(req: ShowStatsRunRequest, ctx: ToolContext) -> StatsRunView:
    return stats_view(Repository(ctx.repo_root), req.run, req.stats)


TOOL = register(
    Tool(
        name="show_stats_run",
        request=ShowStatsRunRequest,
        result=StatsRunView,
        fn=show_stats_run,
        summary="Show one stored statistics run: findings with their modules, and the chosen statistics per module "
        "(activations and gradients over the sampled steps, in execution order) and per module type.",
    )
)
