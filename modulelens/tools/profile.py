"""profile: time a capture or an operator card fairly and explain every number."""

from __future__ import annotations

from pydantic import Field

from modulelens.profiling.targets import ProfileOptions, ProfileResult, profile_target
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ProfileRequest(ProfileOptions):
    target: str = Field(description="Capture ref (blk), card id (blk/0) or candidate id (blk.card6:v1).",
                        json_schema_extra={"cli": "argument"})


def profile(req: ProfileRequest, ctx: ToolContext) -> ProfileResult:
    return profile_target(Repository(ctx.repo_root), req.target, req, ctx.progress)


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.2f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


TOOL = register(
    Tool(
        name="profile",
        request=ProfileRequest,
        result=ProfileResult,
        fn=profile,
        summary="Time a capture, card or candidate (median, p20/p80; profiler breakdown).",
    )
)
