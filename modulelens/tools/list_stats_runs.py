"""list_stats_runs: the training statistics (from gather_stats) stored in the repository."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.listing import LeftOut, keep_first
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.stats.runs import StatsRunEntry, stats_entries


class ListStatsRunsRequest(BaseModel):
    name: str | None = Field(None, description="Only this name's versions.")
    limit: int | None = Field(20, ge=1, description="Entries listed (null: all).")


class ListStatsRunsResult(BaseModel):
    repo: str = Field(description="The repository folder.")
    runs: list[StatsRunEntry]
    left_out: list[LeftOut] = Field(default_factory=list)


def list_stats_runs(req: ListStatsRunsRequest, ctx: ToolContext) -> ListStatsRunsResult:
    repo = Repository(ctx.repo_root)
    result = ListStatsRunsResult(repo=str(repo.root), runs=stats_entries(repo, req.name))
    return keep_first(result, "runs", req.limit, "modulelens://stats")


TOOL = register(
    Tool(
        name="list_stats_runs",
        request=ListStatsRunsRequest,
        result=ListStatsRunsResult,
        fn=list_stats_runs,
        summary="List stored statistics runs.",
    )
)
