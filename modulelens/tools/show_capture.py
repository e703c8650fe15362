"""show_capture: what a capture holds and how it can be replayed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from modulelens.capture.manifest import KIND, capture_manifest
from modulelens.capture.summary import CaptureSummary, render_summary, summarize
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ShowCaptureRequest(BaseModel):
    ref: str = Field(description="Capture reference: name, name:v3 or name@tag.", json_schema_extra={"cli": "argument"})


class ShowCaptureResult(CaptureSummary):
    manifest: dict[str, Any] = Field(description="The full manifest (init arguments, specs, checksums).")


def show_capture(req: ShowCaptureRequest, ctx: ToolContext) -> ShowCaptureResult:
    repo = Repository(ctx.repo_root)
    art = repo.open(KIND, req.ref)
    aliases = sorted(k for k, v in repo.aliases(KIND, art.name).items() if v == art.version)
    manifest = capture_manifest(art).model_dump(mode="json")
    return ShowCaptureResult(**summarize(art, aliases).model_dump(), manifest=manifest)


TOOL = register(
    Tool(
        name="show_capture",
        request=ShowCaptureRequest,
        result=ShowCaptureResult,
        fn=show_capture,
        summary="Show one capture: module, class, inputs/outputs, replay strategies, notes and its manifest.",
        render=lambda r: render_summary(r),
    )
)
