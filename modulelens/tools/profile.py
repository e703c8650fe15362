"""profile: time a capture or an operator card fairly and explain every number."""

from __future__ import annotations

from pydantic import Field

from modulelens.listing import keep_first
from modulelens.profiling.targets import ProfileOptions, ProfileResult, profile_target
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ProfileRequest(ProfileOptions):
    target: str = Field(description="Capture ref (blk), card id (blk/0) or candidate id (blk.card6:v1).",
                        json_schema_extra={"cli": "argument"})
    limit: int | None = Field(10, ge=1, description="Entries listed (null: all).")


def profile(req: ProfileRequest, ctx: ToolContext) -> ProfileResult:
    result = profile_target(Repository(ctx.repo_root), req.target, req, ctx.progress)
    return keep_breakdown(result, req.limit)


def keep_breakdown(result: ProfileResult, limit: int | None) -> ProfileResult:
    """``result`` with the ``limit`` operators of its breakdown that took the most time (None: all)."""
    if result.breakdown is None:
        return result
    return keep_first(result, "breakdown", limit, f"profile {result.target} with a larger limit")


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
