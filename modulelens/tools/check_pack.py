"""check_pack: replay each captured module with a pack applied; compare and time with and without."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.dispatch.check import CaptureCheck
from modulelens.dispatch.runtime import DEFAULT_MECHANISM, Mechanism
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class CheckPackRequest(BaseModel):
    pack: str = Field(description="The pack file.", json_schema_extra={"cli": "argument"})
    captures: list[str] = Field(default_factory=list, description="Captures to replay (default: those the pack's "
                                "entries came from).", json_schema_extra={"cli": "argument"})
    allow_env_mismatch: bool = Field(False, description="Load a pack made with another torch, device or compiler.")
    mechanism: Mechanism = Field(DEFAULT_MECHANISM, description="library or mode (see run).")
    min_run_time: float = Field(0.3, gt=0, description="Seconds of timing per module and side.")


class CheckPackResult(BaseModel):
    ok: bool = Field(description="Every replay with the pack matches the captured outputs.")
    checks: list[CaptureCheck]


def check_pack(req: CheckPackRequest, ctx: ToolContext) -> CheckPackResult:
    from modulelens.dispatch.check import check_pack as check

    checks = check(Repository(ctx.repo_root), req.pack, req.captures, allow_env_mismatch=req.allow_env_mismatch,
                   mechanism=req.mechanism, min_run_time=req.min_run_time)
    return CheckPackResult(ok=all(c.matches_captured for c in checks), checks=checks)


TOOL = register(
    Tool(
        name="check_pack",
        request=CheckPackRequest,
        result=CheckPackResult,
        fn=check_pack,
        summary="Prove a pack on its captures: replay each captured module with the pack applied (same RNG state), "
        "compare with the captured outputs and an eager replay, and time the module with and without the pack.",
    )
)
