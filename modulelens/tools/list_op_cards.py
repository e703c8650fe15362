"""list_op_cards: the cards of an opset, ranked by time share, with their rooflines."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.ops.summary import OpSetSummary, summarize_opset
from modulelens.profiling.bandwidth import copy_bytes_per_s
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ListOpCardsRequest(BaseModel):
    ref: str = Field(description="Opset reference (the capture's name: blk, blk:v2, blk@tag).",
                     json_schema_extra={"cli": "argument"})
    kind: str | None = Field(None, description="Only cards of this kind: memory, compute or view.")
    top: int | None = Field(None, ge=1, description="Only the first N cards.")


def list_op_cards(req: ListOpCardsRequest, ctx: ToolContext) -> OpSetSummary:
    return summarize_opset(Repository(ctx.repo_root), req.ref, kind=req.kind, top=req.top,
                           copy_bandwidth=copy_bytes_per_s)


TOOL = register(
    Tool(
        name="list_op_cards",
        request=ListOpCardsRequest,
        result=OpSetSummary,
        fn=list_op_cards,
        summary="List the operator cards of an opset (from capture-ops), ranked by share of the module's run time, "
        "with each memory-bound card's achieved bandwidth as a fraction of this machine's copy bandwidth.",
    )
)
