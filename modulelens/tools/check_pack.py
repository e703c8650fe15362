"""check_pack: replay each captured module with a pack applied; compare and time with and without."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.dispatch.check import CaptureCheck
from modulelens.dispatch.runtime import DEFAULT_MECHANISM, Mechanism
from modulelens.listing import MAX_ITEMS, LeftOut, keep_first, keep_first_each
from modulelens.registry import ToolContext, tool
from modulelens.replies import NextCall, ToolReply, call
from modulelens.repo import Repository


class CheckPackRequest(BaseModel):
    pack: str = Field(description="Pack file or stored pack NAME[:vN].", json_schema_extra={"cli": "argument"})
    captures: list[str] = Field(default_factory=list, description="Default: the pack's.", json_schema_extra={"cli": "argument"})
    allow_env_mismatch: bool = Field(False, description="Allow another torch, device or compiler.")
    mechanism: Mechanism = Field(DEFAULT_MECHANISM, description="How calls reach the pack's kernels: library "
                                 "(default; kernels for the packed operators only, cheaper) or mode (a dispatch mode "
                                 "that sees every aten call).")
    min_run_time: float = Field(0.3, gt=0, description="Seconds at least.")
    limit: int = Field(8, ge=1, le=MAX_ITEMS, description="Entries listed.")


class CheckPackResult(ToolReply):
    summary: str = Field("", description="Hits first; with none, says so and claims no speedup.")
    ok: bool = Field(description="Every replay matched (outputs, and gradients where captured) and every entry "
                     "that could be tested was hit.")
    hits: int = 0
    not_hit: list[str] = Field(default_factory=list, description="Entries that could be tested but were not hit, why.")
    untested: list[str] = Field(default_factory=list, description="Entries the captures cannot test, and why.")
    recorded: str | None = Field(None, description="Where this check was recorded (the stored pack's results).")
    checks: list[CaptureCheck]
    left_out: list[LeftOut] = Field(default_factory=list, description="Lists cut short: `limit` captures, and "
                                    "`limit` pack entries shared among them.")
    pack_file: str = Field("", description="The pack file checked (resolved; a stored pack's pack.json).")


@tool
def check_pack(req: CheckPackRequest, ctx: ToolContext) -> CheckPackResult:
    """Replay a pack's captures with it, vs captured outputs and eager."""
    from modulelens.dispatch.check import check_pack as check
    from modulelens.dispatch.check import entry_coverage
    from modulelens.team.packs import pack_file

    repo = Repository(ctx.repo_root)
    pack_path = pack_file(repo, req.pack, ctx.project)
    replayed = ", ".join(req.captures) or "the pack's captures"
    ctx.progress(0, 1, f"replaying {replayed} with and without {req.pack}")
    checks, runtime = check(repo, str(pack_path), req.captures,
                            allow_env_mismatch=req.allow_env_mismatch, mechanism=req.mechanism,
                            min_run_time=req.min_run_time, progress=lambda m: ctx.progress(0, 1, m),
                            on_capture=lambda i, n, ref: ctx.progress(i, n, f"replaying capture {i + 1}/{n}, {ref}: "
                                                                          "with the pack, then timed with and without it"))
    not_hit, untested = entry_coverage(runtime, checks)
    hits = sum(c.hits for c in checks)
    matched = all(c.matches_captured and c.grads_match is not False for c in checks)
    summary = ("0 hits: no entry was used by the replays; no speedup claimed" if hits == 0 else
               f"{hits} hits; " + ("every testable entry hit and matched" if matched and not not_hit else
                                   f"{len(not_hit)} entries not hit" if matched else "a replay did not match"))
    result = CheckPackResult(summary=summary, ok=matched and hits > 0 and not not_hit, hits=hits, not_hit=not_hit,
                             untested=untested, checks=checks,
                             pack_file=str(pack_path))
    if hits == 0:
        result.warnings.append("no pack kernel ran in any replay (0 hits): the pack changes nothing here")
    result.warnings += [f"{c.capture}: with the pack, outputs differ from the captured ones ({c.detail})"
                        for c in checks if not c.matches_captured][:3]
    result.warnings += [f"{c.capture}: the module's speedup with the pack is undetermined: {c.timing_reason}"
                        for c in checks if c.hits and c.timing_status == "undetermined"][:3]
    result.warnings += [f"{x} (ok needs every testable entry hit)" for x in not_hit[:3]]
    result.recorded = _record(repo, runtime.pack.sha256, result, req.captures)
    result.next = check_pack_next(result, req.pack, [_script_of(repo, c.capture) for c in checks])
    if result.ok and result.next and "script" not in result.next[0].arguments:
        result.warnings.append("the captures were not made by a script run here: give run the training script "
                               "([--script FILE]) to time the pack in it")
    return keep_check_lists(result, req.limit)


def _script_of(repo: Repository, capture: str) -> tuple[str, list[str]] | None:
    """(script, its arguments) that made ``capture``, or None (the Python API, a KernelBench file)."""
    from modulelens.capture import KIND as CAPTURES
    from modulelens.capture import capture_manifest

    source = capture_manifest(repo.open(CAPTURES, capture)).source
    return (source.script, list(source.argv)) if source.kind == "script" and source.script else None


def check_pack_next(result: CheckPackResult, pack: str, scripts: list[tuple[str, list[str]] | None]) -> list[NextCall]:
    """The call after a check: a passing one leads to ``run`` with ``compare`` (the pack timed in
    the training script itself), on the script that made the first capture when one did; a failing
    one to the pack's view (which entries are used, their verdicts and last results)."""
    if not result.ok:
        return [call("show", kind="packs", ref=pack)]
    script = next((s for s in scripts if s is not None), None)
    if script is None:
        return [call("run", pack=pack, compare=True)]
    return [call("run", script=script[0], script_args=script[1] or None, pack=pack, compare=True)]


def _record(repo: Repository, sha256: str, result: CheckPackResult, captures: list[str]) -> str | None:
    """Record the check with the stored pack of the same content, if there is one."""
    from modulelens.dispatch.results import PackResultManifest, outcomes, record_result
    from modulelens.team.packs import stored_pack_for

    stored = stored_pack_for(repo, sha256)
    if stored is None:
        return None
    entries = [e for c in result.checks for e in c.entries]
    rec = PackResultManifest(pack=stored.ref, sha256=sha256, tool="check_pack",
                             subject=", ".join(c.capture for c in result.checks) or ", ".join(captures),
                             ok=result.ok, hits=result.hits, fallbacks=sum(c.fallbacks for c in result.checks),
                             summary=result.summary, entries=outcomes(entries))
    return record_result(repo, stored, sha256, rec).ref


def keep_check_lists(result: CheckPackResult, limit: int | None) -> CheckPackResult:
    """``result`` with at most ``limit`` captures (None: all) and ``limit`` pack entries shared
    among them (``ok`` still covers every capture)."""
    again = "check_pack again with a larger [--limit N]"
    result = keep_first(result, "checks", limit, again)
    return keep_first_each(result, "checks", "entries", limit, lambda i, check: again)
