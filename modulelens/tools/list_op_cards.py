"""list_op_cards: the cards of an opset, ranked by time share, with their rooflines."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from modulelens.ops.summary import OpSetSummary, summarize_opset
from modulelens.profiling.bandwidth import copy_bytes_per_s
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ListOpCardsRequest(BaseModel):
    ref: str = Field(description="Opset ref (the capture's name).",
                     json_schema_extra={"cli": "argument"})
    kind: Literal["memory", "compute", "view"] | None = Field(None)
    top: int | None = Field(10, ge=1, description="Null: all.")


def list_op_cards(req: ListOpCardsRequest, ctx: ToolContext) -> OpSetSummary:
    return summarize_opset(Repository(ctx.repo_root), req.ref, kind=req.kind, top=req.top,
                           copy_bandwidth=copy_bytes_per_s)


TOOL = register(
    Tool(
        name="list_op_cards",
        request=ListOpCardsRequest,
        result=OpSetSummary,
        fn=list_op_cards,
        summary="List an opset's cards by time share, with roofline fractions.",
    )
)
