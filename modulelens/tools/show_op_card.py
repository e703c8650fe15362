"""show_op_card: one operator card in full (variant, calls, timing, sample specs)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.ops.summary import CardDetail, describe_card
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ShowOpCardRequest(BaseModel):
    card: str = Field(description="Card id: <opset>/<index>, e.g. blk/0 or blk:v2/3.", json_schema_extra={"cli": "argument"})


def show_op_card(req: ShowOpCardRequest, ctx: ToolContext) -> CardDetail:
    return describe_card(Repository(ctx.repo_root), req.card)


def _render(r: CardDetail):
    from rich.markup import escape

    lines = [
        f"[bold]{escape(r.card_id)}[/]  {escape(r.op)}  ({r.kind}, {r.phase}) on {escape(r.device)}",
        "inputs: " + escape(", ".join(f"{d}{s}{'' if c else ' non-contiguous'}" for s, d, c in zip(r.shapes, r.dtypes, r.contiguous))),
        f"other args: {escape(str(r.args))}",
        f"calls per module run: {r.calls}; median {r.time_s * 1e6:.1f} us per run = {r.time_share:.1%} of the module",
        f"bytes per call (inputs + outputs): {r.bytes_per_call}",
        f"samples stored: {len(r.samples)} (from capture {escape(r.capture)})",
    ]
    return "\n".join(lines)


TOOL = register(
    Tool(
        name="show_op_card",
        request=ShowOpCardRequest,
        result=CardDetail,
        fn=show_op_card,
        summary="Show one operator card: operator, input shapes/dtypes/strides, arguments, calls, time share, samples.",
        render=_render,
    )
)
