"""list_packs: the kernel packs stored in the repository, with their entries, shape rules, hits
from the last run and the last check."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.listing import LeftOut, keep_first
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.team.pack_listing import PackListing, pack_listings


class ListPacksRequest(BaseModel):
    limit: int | None = Field(20, ge=1, description="Entries listed (null: all).")


class ListPacksResult(BaseModel):
    repo: str = Field(description="The repository folder.")
    packs: list[PackListing]
    left_out: list[LeftOut] = Field(default_factory=list)


def list_packs(req: ListPacksRequest, ctx: ToolContext) -> ListPacksResult:
    repo = Repository(ctx.repo_root)
    result = ListPacksResult(repo=str(repo.root), packs=pack_listings(repo))
    return keep_first(result, "packs", req.limit, "list_packs with a larger limit")


TOOL = register(
    Tool(
        name="list_packs",
        request=ListPacksRequest,
        result=ListPacksResult,
        fn=list_packs,
        summary="List stored packs with entries, hits and checks.",
    )
)
