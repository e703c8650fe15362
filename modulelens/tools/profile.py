"""profile: time a capture or an operator card fairly and explain every number."""

from __future__ import annotations

from pydantic import Field

from modulelens.listing import MAX_ITEMS, keep_first
from modulelens.profiling.targets import ProfileOptions, ProfileResult, profile_target
from modulelens.registry import ToolContext, tool
from modulelens.replies import call
from modulelens.repo import Repository


class ProfileRequest(ProfileOptions):
    target: str = Field(description="Capture ref, card id or candidate id.",
                        json_schema_extra={"cli": "argument"})
    limit: int = Field(10, ge=1, le=MAX_ITEMS, description="Entries listed.")


@tool
def profile(req: ProfileRequest, ctx: ToolContext) -> ProfileResult:
    """Time a capture, card or candidate (median, p20/p80; profiler breakdown)."""
    result = profile_target(Repository(ctx.repo_root), req.target, req, ctx.progress)
    if result.runs < 10 or (result.median_s and (result.p80_s - result.p20_s) > result.median_s):
        result.warnings.append(f"a noisy or short measurement ({result.runs} runs, p20-p80 {result.p20_s:.3g}-"
                               f"{result.p80_s:.3g} s): compare speeds only with a longer [--min-run-time]")
    result.warnings += [n for n in result.notes if "synthes" in n or "not comparable" in n]
    if result.target_kind == "card":
        result.next = [call("generate_kernel", card=result.target)]
    return keep_breakdown(result, req.limit)


def keep_breakdown(result: ProfileResult, limit: int | None) -> ProfileResult:
    """``result`` with the ``limit`` operators of its breakdown that took the most time (None: all)."""
    if result.breakdown is None:
        return result
    return keep_first(result, "breakdown", limit, "profile again with a larger [--limit N]")


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.2f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"
