"""pack: gather validated candidates (card-level and module-level) into one checksummed pack,
stored in the repository as ``packs/NAME/vN`` (and written to a file when asked)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from modulelens.paths import output_file
from modulelens.registry import ToolContext, tool
from modulelens.replies import NextCall, ToolReply, call
from modulelens.repo import Repository
from modulelens.timing import surely_above_one


class PackRequest(BaseModel):
    candidates: list[str] = Field(json_schema_extra={"cli": "argument"})
    out: str | None = Field(None, description="Also write this file.")
    force: bool = Field(False, description="Use entries even when not surely faster than eager.")
    allow_outside: bool = Field(False, description="Read or write a path outside the project and the repository.")


class PackedEntry(BaseModel):
    candidate_id: str
    kind: str = Field(description="op (one aten operator call) or module (a module's forward).")
    target: str = Field(description="aten overload, or module class at module path.")
    phase: str = Field("forward", description="Op entries: forward, or backward (called by the autograd engine).")
    backend: str
    verdict: str
    speedup_vs_eager: float | None = Field(None, description="Measured at validation; null when not timed or undetermined.")
    speedup_interval: list[float] | None = Field(None, description="Its 95% interval at validation.")
    shape_rule: str | None = Field(None, description="The checked shape rule calls are admitted by, per variable "
                                    "dimension: where it is (argument A, dim D), its captured size and the sizes admitted; "
                                    "null: exact shapes.")
    dispatched: bool = Field(description="Whether it will be used: only entries validated correct whose speedup "
                             "interval's lower bound is above 1 (or forced).")
    forced: bool = Field(False, description="Used because of force, whatever its speedup interval says.")
    skip_reason: str | None = None


class PackResult(ToolReply):
    ref: str = Field(description="The stored pack (NAME:vN): pass it to run and check_pack.")
    path: str = Field(description="The pack file: [--out], else the stored version's pack.json.")
    sha256: str = Field(description="sha256 of the pack's content; pass it as [--expect-sha256] to refuse any other pack.")
    environment: dict = Field(description="torch version, device name and compiler the pack is tied to.")
    entries: list[PackedEntry]


def _interval(interval: list[float] | None) -> str:
    return f"95% interval {interval[0]:.2f}x..{interval[1]:.2f}x" if interval else "no speedup interval"


def _default_name(out: Path | None, candidates: list[str]) -> str | None:
    """The stored name: the out file's (its stem), else the first candidate's capture's name."""
    if out is not None:
        return None  # store_pack names it after the file
    first = candidates[0].partition(":")[0]
    return first.split(".card")[0].removesuffix(".module") + "-pack"


@tool
def pack(req: PackRequest, ctx: ToolContext) -> PackResult:
    """Pack validated candidates (stored as packs/NAME/vN)."""
    from modulelens.dispatch.build import make_pack
    from modulelens.team.packs import STORED_PACK_FILE, store_pack

    repo = Repository(ctx.repo_root)
    out = output_file(req.out, ctx.project) if req.out is not None else None  # "" is refused, not ignored
    name = _default_name(out, req.candidates)
    if out is not None:
        sha, content = make_pack(repo, req.candidates, out, force=req.force)
        stored = store_pack(repo, out, name)
        path = out
    else:
        with tempfile.TemporaryDirectory(prefix="modulelens-pack-") as tmp:
            file = Path(tmp) / STORED_PACK_FILE
            sha, content = make_pack(repo, req.candidates, file, force=req.force)
            stored = store_pack(repo, file, name)
        path = stored.path / STORED_PACK_FILE
    result = PackResult(ref=stored.ref, path=str(path), sha256=sha, environment=content.environment.model_dump(), entries=[
        PackedEntry(candidate_id=e.candidate_id, kind=e.kind,
                    target=e.op if e.kind == "op" else f"{e.class_path} at {e.module_path}", phase=e.phase,
                    backend=e.backend, verdict=e.report.verdict, speedup_vs_eager=e.speedup_vs_eager,
                    speedup_interval=e.speedup_interval, shape_rule=e.shape_rule.summary() if e.shape_rule else None,
                    dispatched=e.skip_reason() is None, forced=e.forced, skip_reason=e.skip_reason())
        for e in content.entries])
    result.warnings = [f"{e.candidate_id} will not be used: {e.skip_reason}" for e in result.entries if not e.dispatched]
    forced = [e for e in result.entries if e.forced and not surely_above_one(e.speedup_interval)]
    result.warnings += [f"{e.candidate_id} is used because of force, although its speedup is not surely above 1 "
                        f"({_interval(e.speedup_interval)})" for e in forced]
    if not any(e.dispatched for e in result.entries):
        result.warnings.insert(0, "no entry of this pack will be used: every call will run eager")
    result.next = pack_next(result.entries, req, result.ref)
    return result


def pack_next(entries: list[PackedEntry], req: PackRequest, ref: str) -> list[NextCall]:
    """The calls after packing: check the pack when an entry will be used; when none will, what
    makes them usable: validating again (timed) the entries that have no speedup interval, showing
    the entries not validated correct (their report says what to fix), and, for entries correct
    but not surely faster, packing them again with ``force`` (the warnings say what that means)."""
    if any(e.dispatched for e in entries):
        return [call("check_pack", pack=ref)]
    unused = [e for e in entries if not e.dispatched]
    wrong = [e for e in unused if e.verdict == "rejected" or (e.skip_reason or "").startswith("not validated correct")]
    untimed = [e for e in unused if e not in wrong and not e.speedup_interval]
    slow = [e for e in unused if e not in wrong and e not in untimed]
    out = [call("validate_kernel", candidate=e.candidate_id, time=True) for e in untimed[:2]]
    out += [call("show", kind="candidates", ref=e.candidate_id) for e in wrong[:1]]
    if slow:
        out.append(call("pack", candidates=req.candidates, out=req.out, force=True))
    return out
