"""list_stats_runs: the training statistics (from gather_stats) stored in the repository."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.stats.runs import StatsRunEntry, stats_entries
from modulelens.tables import rows_table


class ListStatsRunsRequest(BaseModel):
    pass


class ListStatsRunsResult(BaseModel):
    repo: str = Field(description="The repository folder.")
    runs: list[StatsRunEntry]


def list_stats_runs(req: ListStatsRunsRequest, ctx: ToolContext) -> ListStatsRunsResult:
    repo = Repository(ctx.repo_root)
    return ListStatsRunsResult(repo=str(repo.root), runs=stats_entries(repo))


def _render(r: ListStatsRunsResult):
    return rows_table(f"statistics in {r.repo}", ("run", "of", "modules", "sampled steps", "findings"),
                      ((x.run_id, x.capture or x.script, x.modules, x.steps_sampled, x.findings) for x in r.runs))

TOOL = register(
    Tool(
        name="list_stats_runs",
        request=ListStatsRunsRequest,
        result=ListStatsRunsResult,
        fn=list_stats_runs,
        summary="List the statistics stored by gather-stats: script or capture, modules, sampled steps, findings.",
        render=_render,
    )
)
