"""show_op_card: one operator card in full (variant, calls, timing, sample specs)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.ops.summary import CardDetail, describe_card
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ShowOpCardRequest(BaseModel):
    card: str = Field(description="Card id: blk/0, blk:v2/3.", json_schema_extra={"cli": "argument"})


def show_op_card(req: ShowOpCardRequest, ctx: ToolContext) -> CardDetail:
    return describe_card(Repository(ctx.repo_root), req.card)


TOOL = register(
    Tool(
        name="show_op_card",
        request=ShowOpCardRequest,
        result=CardDetail,
        fn=show_op_card,
        summary="Show one operator card in full, with its samples.",
    )
)
