"""list_opsets: the operator-card sets (from capture_ops) in the repository."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.listing import LeftOut, keep_first
from modulelens.ops.model import KIND
from modulelens.ops.opsets import OpsetEntry, opset_entries
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ListOpsetsRequest(BaseModel):
    capture: str | None = Field(None, description="Only opsets of this capture.")
    limit: int | None = Field(25, ge=1, description="Entries listed (null: all).")


class ListOpsetsResult(BaseModel):
    repo: str = Field(description="The repository folder.")
    opsets: list[OpsetEntry]
    left_out: list[LeftOut] = Field(default_factory=list)


def list_opsets(req: ListOpsetsRequest, ctx: ToolContext) -> ListOpsetsResult:
    repo = Repository(ctx.repo_root)
    result = ListOpsetsResult(repo=str(repo.root), opsets=opset_entries(repo, req.capture))
    return keep_first(result, "opsets", req.limit, str(repo.root / KIND))


TOOL = register(
    Tool(
        name="list_opsets",
        request=ListOpsetsRequest,
        result=ListOpsetsResult,
        fn=list_opsets,
        summary="List operator-card sets (one per capture_ops run).",
    )
)
