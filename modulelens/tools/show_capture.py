"""show_capture: what a capture holds and how it can be replayed; optionally the statistics of
every tensor it holds."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from modulelens.capture.manifest import KIND, capture_manifest
from modulelens.capture.summary import CaptureSummary, summarize
from modulelens.listing import LeftOut, keep_first
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.stats.runs import TensorStatsRow, capture_tensor_rows


class ShowCaptureRequest(BaseModel):
    ref: str = Field(description="Capture ref.", json_schema_extra={"cli": "argument"})
    tensors: bool = Field(False, description="Also every tensor's shape, dtype and statistics.")
    top: int | None = Field(20, ge=1, description="At most this many tensors (null: all).")
    manifest: bool = Field(False, description="Also the full manifest.")


class ShowCaptureResult(CaptureSummary):
    manifest: dict[str, Any] = Field(default_factory=dict, description="With manifest: the full manifest.")
    tensors: list[TensorStatsRow] = Field(
        default_factory=list, description="With tensors: inputs, outputs, weights (and gradients when captured), in "
        "that order. std is the population std; kurtosis is the excess kurtosis.")
    tensor_notes: list[str] = Field(default_factory=list, description="With tensors: how shape-only tensors were "
                                    "described.")
    left_out: list[LeftOut] = Field(default_factory=list, description="Lists cut to `top` items.")


def show_capture(req: ShowCaptureRequest, ctx: ToolContext) -> ShowCaptureResult:
    repo = Repository(ctx.repo_root)
    art = repo.open(KIND, req.ref)
    aliases = sorted(k for k, v in repo.aliases(KIND, art.name).items() if v == art.version)
    manifest = capture_manifest(art).model_dump(mode="json") if req.manifest else {}
    rows, notes = [], []
    if req.tensors:
        _, rows, notes = capture_tensor_rows(repo, art.ref)
    result = ShowCaptureResult(**summarize(art, aliases).model_dump(), manifest=manifest, tensors=rows,
                               tensor_notes=notes)
    return keep_first(result, "tensors", req.top, f"show_capture {art.ref} with tensors and a larger top")


TOOL = register(
    Tool(
        name="show_capture",
        request=ShowCaptureRequest,
        result=ShowCaptureResult,
        fn=show_capture,
        summary="Show one capture, optionally with tensor statistics.",
    )
)
