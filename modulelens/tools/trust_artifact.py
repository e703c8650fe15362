"""trust: show what an artifact would run, and trust it (sign it with this machine's key)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.repo.trust import TrustReview, review, trust


class TrustRequest(BaseModel):
    ref: str = Field(description="Artifact reference: name, name:v3 or name@tag.", json_schema_extra={"cli": "argument"})
    kind: Literal["captures", "opsets", "candidates", "reports", "stats"] = Field(
        "captures", description="What kind of artifact the reference names.")
    yes: bool = Field(False, description="Trust it. Without this, only show what trusting it would allow to run.")


class TrustResult(TrustReview):
    signed: bool = Field(False, description="This call signed the artifact.")


def trust_artifact(req: TrustRequest, ctx: ToolContext) -> TrustResult:
    art = Repository(ctx.repo_root).open(req.kind, req.ref)
    if req.yes:
        return TrustResult(**trust(art).model_dump(), signed=True)
    return TrustResult(**review(art).model_dump())


def render_trust(r: TrustResult) -> str:
    """Plain text: the state, then one line per thing that would run (non-ASCII escaped)."""
    state = "signed now: trusted" if r.signed else ("trusted" if r.trusted else "NOT trusted")
    lines = [f"{r.ref}: {state}"]
    lines += [f"  code file {name}: {why}" for name, why in r.code_files.items()]
    lines += [f"  imports {path}" for path in r.class_paths]
    lines += [f"  names a path outside the artifact: {path!r}" for path in r.escaping_paths]
    lines += [f"  checksum problem: {p}" for p in r.checksum_problems]
    if not r.trusted:
        lines.append(f"  trust it with: modulelens trust {r.ref} --yes")
    return "\n".join(x.encode("ascii", "backslashreplace").decode() for x in lines)


TOOL = register(
    Tool(
        name="trust",
        request=TrustRequest,
        result=TrustResult,
        fn=trust_artifact,
        summary="Show what an artifact would run (programs, scripts, imported classes) and, with --yes, trust it.",
        render=render_trust,
    )
)
