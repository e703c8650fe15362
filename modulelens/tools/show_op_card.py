"""show_op_card: one operator card in full (variant, calls, timing, sample specs)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from modulelens.ops.cards import open_card
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.tools.capture_ops import CardSummary


class ShowOpCardRequest(BaseModel):
    card: str = Field(description="Card id: <opset>/<index>, e.g. blk/0 or blk:v2/3.", json_schema_extra={"cli": "argument"})


class ShowOpCardResult(CardSummary):
    opset: str
    capture: str
    samples: list[dict[str, Any]] = Field(description="Stored sample calls: args, kwargs and output as value specs.")


def show_op_card(req: ShowOpCardRequest, ctx: ToolContext) -> ShowOpCardResult:
    art, card = open_card(Repository(ctx.repo_root), req.card)
    card = {**card, "card_id": f"{art.ref}/{card['index']}"}
    return ShowOpCardResult(**{k: v for k, v in card.items() if k in ShowOpCardResult.model_fields},
                            opset=art.ref, capture=art.manifest["capture"])


def _render(r: ShowOpCardResult):
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
        result=ShowOpCardResult,
        fn=show_op_card,
        summary="Show one operator card: operator, input shapes/dtypes/strides, arguments, calls, time share, samples.",
        render=_render,
    )
)
