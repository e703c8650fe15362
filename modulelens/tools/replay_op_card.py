"""replay_op_card: run a card's operator alone on its stored sample and compare with the eager output."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.ops.replay import CardReplay, replay_card
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ReplayOpCardRequest(BaseModel):
    card: str = Field(description="Card id: blk/0.", json_schema_extra={"cli": "argument"})
    sample: int = Field(0, ge=0, description="Stored sample index.")


def replay_op_card(req: ReplayOpCardRequest, ctx: ToolContext) -> CardReplay:
    return replay_card(Repository(ctx.repo_root), req.card, req.sample)


TOOL = register(
    Tool(
        name="replay_op_card",
        request=ReplayOpCardRequest,
        result=CardReplay,
        fn=replay_op_card,
        summary="Replay a card's op on a stored sample vs its eager output.",
    )
)
