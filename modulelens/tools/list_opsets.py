"""list_opsets: the operator-card sets (from capture_ops) in the repository."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.ops.opsets import OpsetEntry, opset_entries
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ListOpsetsRequest(BaseModel):
    capture: str | None = Field(None, description="Only opsets of this capture.")


class ListOpsetsResult(BaseModel):
    repo: str = Field(description="The repository folder.")
    opsets: list[OpsetEntry]


def list_opsets(req: ListOpsetsRequest, ctx: ToolContext) -> ListOpsetsResult:
    repo = Repository(ctx.repo_root)
    return ListOpsetsResult(repo=str(repo.root), opsets=opset_entries(repo, req.capture))


TOOL = register(
    Tool(
        name="list_opsets",
        request=ListOpsetsRequest,
        result=ListOpsetsResult,
        fn=list_opsets,
        summary="List operator-card sets (one per capture_ops run).",
    )
)
