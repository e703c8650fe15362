"""show_capture: what a capture holds and how it can be replayed; optionally the statistics of
every tensor it holds."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from modulelens.capture.manifest import KIND, capture_manifest
from modulelens.capture.summary import CaptureSummary, summarize
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.stats.runs import TensorStatsRow, capture_tensor_rows


class ShowCaptureRequest(BaseModel):
    ref: str = Field(description="Capture reference: name, name:v3 or name@tag.", json_schema_extra={"cli": "argument"})
    tensors: bool = Field(False, description="Also give every tensor the capture holds (inputs, outputs, weights, "
                          "gradients) with shape, dtype and statistics, computed now and stored nowhere.")


class ShowCaptureResult(CaptureSummary):
    manifest: dict[str, Any] = Field(description="The full manifest (init arguments, specs, checksums).")
    tensors: list[TensorStatsRow] = Field(
        default_factory=list, description="With tensors: inputs, outputs, weights (and gradients when captured), in "
        "that order. std is the population std; kurtosis is the excess kurtosis.")
    tensor_notes: list[str] = Field(default_factory=list, description="With tensors: how shape-only tensors were "
                                    "described.")


def show_capture(req: ShowCaptureRequest, ctx: ToolContext) -> ShowCaptureResult:
    repo = Repository(ctx.repo_root)
    art = repo.open(KIND, req.ref)
    aliases = sorted(k for k, v in repo.aliases(KIND, art.name).items() if v == art.version)
    manifest = capture_manifest(art).model_dump(mode="json")
    rows, notes = [], []
    if req.tensors:
        _, rows, notes = capture_tensor_rows(repo, art.ref)
    return ShowCaptureResult(**summarize(art, aliases).model_dump(), manifest=manifest, tensors=rows,
                             tensor_notes=notes)


TOOL = register(
    Tool(
        name="show_capture",
        request=ShowCaptureRequest,
        result=ShowCaptureResult,
        fn=show_capture,
        summary="Show one capture: module, class, inputs/outputs, replay strategies, notes and its manifest; with "
        "tensors, every tensor's shape, dtype and statistics (mean, std, rms, kurtosis, zeros, min, max, NaN/Inf).",
    )
)
