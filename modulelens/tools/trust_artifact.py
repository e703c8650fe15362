"""trust: show what an artifact would run, and trust it (sign it with this machine's key)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from modulelens.kinds import AcceptSingular
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import Repository, TrustReview
from modulelens.repo import review_trust as review
from modulelens.repo import trust_artifact as sign


class TrustRequest(BaseModel):
    ref: str = Field(description="Artifact ref.", json_schema_extra={"cli": "argument"})
    kind: Annotated[Literal["captures", "opsets", "candidates", "reports", "stats", "packs"], AcceptSingular] = Field(
        "captures")
    yes: bool = Field(False)


class TrustResult(TrustReview, ToolReply):
    signed: bool = Field(False, description="This call signed the artifact.")


@tool
def trust(req: TrustRequest, ctx: ToolContext) -> TrustResult:
    """Show what an artifact would run; with [--yes], trust it."""
    art = Repository(ctx.repo_root).open(req.kind, req.ref)
    if req.yes:
        return TrustResult(**sign(art).model_dump(), signed=True)
    result = TrustResult(**review(art).model_dump())
    if not result.trusted:
        result.warnings.append("untrusted: nothing of it is imported, unpickled or run until it is trusted")
        result.warnings += [f"checksum problem: {p}" for p in result.checksum_problems][:3]
        if not result.checksum_problems:
            result.next = [call("trust", ref=result.ref, kind=req.kind, yes=True)]
    return result
