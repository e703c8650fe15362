"""trust: show what an artifact would run, and trust it (sign it with this machine's key)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.repo.trust import TrustReview, review, trust


class TrustRequest(BaseModel):
    ref: str = Field(description="Artifact ref.", json_schema_extra={"cli": "argument"})
    kind: Literal["captures", "opsets", "candidates", "reports", "stats", "packs"] = Field(
        "captures")
    yes: bool = Field(False, description="Trust it (else only show).")


class TrustResult(TrustReview):
    signed: bool = Field(False, description="This call signed the artifact.")


def trust_artifact(req: TrustRequest, ctx: ToolContext) -> TrustResult:
    art = Repository(ctx.repo_root).open(req.kind, req.ref)
    if req.yes:
        return TrustResult(**trust(art).model_dump(), signed=True)
    return TrustResult(**review(art).model_dump())


TOOL = register(
    Tool(
        name="trust",
        request=TrustRequest,
        result=TrustResult,
        fn=trust_artifact,
        summary="Show what an artifact would run; with [--yes], trust it.",
    )
)
