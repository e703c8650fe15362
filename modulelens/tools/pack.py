"""pack: gather validated candidates (card-level and module-level) into one checksummed pack file."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.paths import output_file
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import Repository


class PackRequest(BaseModel):
    candidates: list[str] = Field(description="Validated candidate ids.",
                                  json_schema_extra={"cli": "argument"})
    out: str = Field(description="Pack file to write (relative: to the project).")
    force: bool = Field(False, description="Use entries not surely faster too.")


class PackedEntry(BaseModel):
    candidate_id: str
    kind: str = Field(description="op (one aten operator call) or module (a module's forward).")
    target: str = Field(description="aten overload, or module class at module path.")
    backend: str
    verdict: str
    speedup_vs_eager: float | None = Field(None, description="Measured at validation; null when not timed or undetermined.")
    speedup_interval: list[float] | None = Field(None, description="Its 95% interval at validation.")
    dispatched: bool = Field(description="Whether it will be used: only entries validated correct whose speedup "
                             "interval's lower bound is above 1 (or forced).")
    forced: bool = Field(False, description="Used because of force, whatever its speedup interval says.")
    skip_reason: str | None = None


class PackResult(ToolReply):
    path: str
    sha256: str = Field(description="sha256 of the pack's content; pass it as [--expect-sha256] to refuse any other pack.")
    environment: dict = Field(description="torch version, device name and compiler the pack is tied to.")
    entries: list[PackedEntry]


def _interval(interval: list[float] | None) -> str:
    return f"95% interval {interval[0]:.2f}x..{interval[1]:.2f}x" if interval else "no speedup interval"


@tool
def pack(req: PackRequest, ctx: ToolContext) -> PackResult:
    """Bundle validated candidates into one checksummed pack file."""
    from modulelens.dispatch.build import make_pack

    out = output_file(req.out, ctx.project)
    sha, content = make_pack(Repository(ctx.repo_root), req.candidates, out, force=req.force)
    result = PackResult(path=str(out), sha256=sha, environment=content.environment.model_dump(), entries=[
        PackedEntry(candidate_id=e.candidate_id, kind=e.kind,
                    target=e.op if e.kind == "op" else f"{e.class_path} at {e.module_path}",
                    backend=e.backend, verdict=e.report.verdict, speedup_vs_eager=e.speedup_vs_eager,
                    speedup_interval=e.speedup_interval, dispatched=e.skip_reason() is None, forced=e.forced,
                    skip_reason=e.skip_reason())
        for e in content.entries])
    result.warnings = [f"{e.candidate_id} will not be used: {e.skip_reason}" for e in result.entries if not e.dispatched]
    forced = [e for e in result.entries if e.forced and (not e.speedup_interval or e.speedup_interval[0] <= 1)]
    result.warnings += [f"{e.candidate_id} is used because of force, although its speedup is not surely above 1 "
                        f"({_interval(e.speedup_interval)})" for e in forced]
    if not any(e.dispatched for e in result.entries):
        result.warnings.insert(0, "no entry of this pack will be used: every call will run eager")
    else:
        result.next = [call("check_pack", pack=result.path)]
    return result
