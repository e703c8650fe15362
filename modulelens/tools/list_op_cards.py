"""list_op_cards: the cards of an opset, ranked by time share."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.ops.cards import KIND, card_summary_fields
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.tools.capture_ops import CaptureOpsResult, CardSummary, render_cards


class ListOpCardsRequest(BaseModel):
    ref: str = Field(description="Opset reference (the capture's name: blk, blk:v2, blk@tag).",
                     json_schema_extra={"cli": "argument"})
    kind: str | None = Field(None, description="Only cards of this kind: memory, compute or view.")
    top: int | None = Field(None, ge=1, description="Only the first N cards.")


def list_op_cards(req: ListOpCardsRequest, ctx: ToolContext) -> CaptureOpsResult:
    art = Repository(ctx.repo_root).open(KIND, req.ref)
    m = art.manifest
    cards = []
    for c in m["cards"]:
        c = {**c, "card_id": f"{art.ref}/{c['index']}"}
        if req.kind is None or c["kind"] == req.kind:
            cards.append(CardSummary(**card_summary_fields(c)))
    all_share = sum(c["time_share"] for c in m["cards"])
    mt = m["module_time"]
    return CaptureOpsResult(
        opset=art.ref, capture=m["capture"], strategy=m["strategy"], module_time_s=mt["median_s"],
        module_time_p20_s=mt["p20_s"], module_time_p80_s=mt["p80_s"], repeats=mt["repeats"],
        cards_time_share=all_share, views_time_share=m["views_time_share"],
        cards=cards[: req.top] if req.top else cards, notes=m.get("notes", []),
    )


TOOL = register(
    Tool(
        name="list_op_cards",
        request=ListOpCardsRequest,
        result=CaptureOpsResult,
        fn=list_op_cards,
        summary="List the operator cards of an opset (from capture-ops), ranked by share of the module's run time.",
        render=render_cards,
    )
)

