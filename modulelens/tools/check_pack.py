"""check_pack: replay each captured module with a pack applied; compare and time with and without."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.dispatch.check import CaptureCheck
from modulelens.dispatch.runtime import DEFAULT_MECHANISM, Mechanism
from modulelens.listing import MAX_ITEMS, LeftOut, keep_first, keep_first_each
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply
from modulelens.repo import Repository


class CheckPackRequest(BaseModel):
    pack: str = Field(json_schema_extra={"cli": "argument"})
    captures: list[str] = Field(default_factory=list, description="Default: the pack's.", json_schema_extra={"cli": "argument"})
    allow_env_mismatch: bool = Field(False, description="Allow another torch, device or compiler.")
    mechanism: Mechanism = Field(DEFAULT_MECHANISM)
    limit: int = Field(8, ge=1, le=MAX_ITEMS, description="Entries listed.")


class CheckPackResult(ToolReply):
    ok: bool = Field(description="Every replay with the pack matches the captured outputs.")
    checks: list[CaptureCheck]
    left_out: list[LeftOut] = Field(default_factory=list, description="Lists cut short: `limit` captures, and "
                                    "`limit` pack entries shared among them.")


@tool
def check_pack(req: CheckPackRequest, ctx: ToolContext) -> CheckPackResult:
    """Replay a pack's captures with it, vs captured outputs and eager."""
    from modulelens.dispatch.check import check_pack as check

    checks = check(Repository(ctx.repo_root), req.pack, req.captures, allow_env_mismatch=req.allow_env_mismatch,
                   mechanism=req.mechanism)
    result = CheckPackResult(ok=all(c.matches_captured for c in checks), checks=checks)
    if not any(c.hits for c in checks):
        result.warnings.append("no pack kernel ran in any replay (0 hits): the pack changes nothing here")
    result.warnings += [f"{c.capture}: with the pack, outputs differ from the captured ones ({c.detail})"
                        for c in checks if not c.matches_captured][:3]
    result.warnings += [f"{c.capture}: the module's speedup with the pack is undetermined: {c.timing_reason}"
                        for c in checks if c.hits and c.timing_status == "undetermined"][:3]
    unused = {e.candidate_id: e.skip_reason for c in checks for e in c.entries if not e.dispatched}
    result.warnings += [f"{cid} was not used: {why}" for cid, why in list(unused.items())[:3]]
    return keep_check_lists(result, req.limit)


def keep_check_lists(result: CheckPackResult, limit: int | None) -> CheckPackResult:
    """``result`` with at most ``limit`` captures (None: all) and ``limit`` pack entries shared
    among them (``ok`` still covers every capture)."""
    again = "check_pack again with a larger [--limit N]"
    result = keep_first(result, "checks", limit, again)
    return keep_first_each(result, "checks", "entries", limit, lambda i, check: again)
