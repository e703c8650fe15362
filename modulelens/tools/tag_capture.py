"""tag_capture: point a user tag (an alias such as ``prod``) at one version of a capture."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.capture import KIND
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply
from modulelens.repo import Repository


class TagCaptureRequest(BaseModel):
    ref: str = Field(description="Capture ref.", json_schema_extra={"cli": "argument"})
    tag: str = Field(json_schema_extra={"cli": "argument"})


class TagCaptureResult(ToolReply):
    ref: str = Field(description="name:vN the tag now points at.")
    tag: str
    previous: str | None = Field(None, description="name:vN the tag pointed at before, if any.")


@tool
def tag_capture(req: TagCaptureRequest, ctx: ToolContext) -> TagCaptureResult:
    """Point a tag at one version of a capture (name@tag)."""
    repo = Repository(ctx.repo_root)
    name, _ = repo.resolve(KIND, req.ref)
    before = repo.aliases(KIND, name).get(req.tag)
    name, version = repo.tag(KIND, req.ref, req.tag)
    return TagCaptureResult(ref=f"{name}:v{version}", tag=req.tag, previous=f"{name}:v{before}" if before else None)
