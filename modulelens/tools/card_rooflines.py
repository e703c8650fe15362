"""card_rooflines: how close each memory-bound card of an opset comes to this machine's copy bandwidth."""

from __future__ import annotations

import torch
from pydantic import BaseModel, Field

from modulelens.ops import opsets
from modulelens.ops.opsets import OpsetRooflines
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.tables import rows_table


class CardRooflinesRequest(BaseModel):
    ref: str = Field(description="Opset reference (the capture's name: blk, blk:v2, blk@tag).",
                     json_schema_extra={"cli": "argument"})


def _copy_bytes_per_s(device: str) -> float | None:
    """The machine's copy bandwidth on ``device`` (measured once per machine, then cached)."""
    from modulelens.profiling.bandwidth import copy_bandwidth

    if device.startswith("cuda") and not torch.cuda.is_available():
        return None
    return copy_bandwidth(device)["bytes_per_s"]


def card_rooflines(req: CardRooflinesRequest, ctx: ToolContext) -> OpsetRooflines:
    return opsets.card_rooflines(Repository(ctx.repo_root), req.ref, _copy_bytes_per_s)


def _render(r: OpsetRooflines):
    gbs = f"{r.copy_bytes_per_s / 1e9:.2f} GB/s" if r.copy_bytes_per_s else "unknown"
    return rows_table(f"rooflines of {r.opset} (copy bandwidth {gbs} on {r.device})",
                      ("card", "op", "kind", "GB/s", "fraction"),
                      ((c.card_id, c.op, c.kind, c.bytes_per_s / 1e9 if c.bytes_per_s else None,
                        f"{c.fraction:.1%}" if c.fraction is not None else None) for c in r.cards))

TOOL = register(
    Tool(
        name="card_rooflines",
        request=CardRooflinesRequest,
        result=OpsetRooflines,
        fn=card_rooflines,
        summary="For each operator card of an opset: achieved bandwidth (bytes moved per module run over its "
        "median time) as a fraction of this machine's measured copy bandwidth (memory-bound cards only).",
        render=_render,
    )
)
