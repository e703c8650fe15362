"""show_search: a search tree, compactly: best path, each node's verdict and latency."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.search.summary import SearchSummary, search_summary


class ShowSearchRequest(BaseModel):
    search_id: str = Field(json_schema_extra={"cli": "argument"})
    limit: int | None = Field(12, ge=1, description="Entries listed (null: all).")


def show_search(req: ShowSearchRequest, ctx: ToolContext) -> SearchSummary:
    return search_summary(Repository(ctx.repo_root), req.search_id, req.limit)


TOOL = register(
    Tool(
        name="show_search",
        request=ShowSearchRequest,
        result=SearchSummary,
        fn=show_search,
        summary="Show an optimize search tree per card.",
    )
)
