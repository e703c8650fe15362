"""run: run an unmodified script with a kernel pack applied; optionally compare with a run without it.

With ``compare``, the run with the pack switches it off and on between steps (warm-up steps, then
pairs of steps in alternating order: see :class:`~modulelens.dispatch.script.ToggleSchedule`), so
with and without are timed in one process, interleaved; the step ratio (time without / time with)
is the median of the pairs' ratios with its 95% interval (:func:`modulelens.timing.measurement_from_rounds`),
a number only when determined and never when no pack kernel ran. A second run without the pack
gives the outputs (losses) to compare with.
"""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel, Field

from modulelens.dispatch.runtime import DEFAULT_MECHANISM, EntryReport, Mechanism
from modulelens.listing import MAX_ITEMS, LeftOut, keep_first
from modulelens.paths import input_script
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.script_progress import script_lines

# With compare, each line the script prints (relayed to stderr) starts with its run's label.
WITH_LABEL, WITHOUT_LABEL = "run 1/2: with the pack", "run 2/2: without the pack"
OUTPUT_TAIL_CHARS = 2000  # of the script's output, in the result (all of it went to stderr)


class RunRequest(BaseModel):
    script: str = Field(json_schema_extra={"cli": "argument"})
    script_args: list[str] = Field(default_factory=list,
                                   json_schema_extra={"cli": "argument"})
    pack: str = Field(description="Pack file or stored pack NAME[:vN].")
    compare: bool = Field(False, description="Also run without the pack and compare outputs.")
    rtol: float = Field(1e-3, ge=0)
    atol: float = Field(1e-4, ge=0)
    allow_env_mismatch: bool = Field(False, description="Allow another torch, device or compiler.")
    expect_sha256: str | None = Field(None, description="Refuse any other pack.")
    mechanism: Mechanism = Field(DEFAULT_MECHANISM, description="How calls reach the pack's kernels: library "
                                 "(default; kernels for the packed operators only, cheaper) or mode (a dispatch mode "
                                 "that sees every aten call).")
    timeout: float = Field(1800.0, gt=0, description="Seconds per run.")
    limit: int = Field(10, ge=1, le=MAX_ITEMS, description="Entries listed.")


class RunResult(ToolReply):
    summary: str = Field("", description="Hits first; with none, says so and claims no speedup.")
    exit_code: int = Field(description="The script's exit code with the pack.")
    script_error: str | None = None
    hits: int = Field(description="Calls that ran a pack kernel (forward and backward).")
    hits_by_phase: dict[str, int] = Field(default_factory=dict, description="forward / backward.")
    fallbacks: int = Field(description="Calls to packed operators/modules that ran eager (see entries for why).")
    mechanism: str
    entries: list[EntryReport]
    steps: int = Field(description="Steps recorded with the pack.")
    step_kind: str
    step_seconds_with: float | None = Field(None, description="Median step time with the pack (warm-up left out).")
    step_seconds_without: float | None = Field(None, description="With [--compare]: the same without the pack "
                                               "(steps of the same run with the pack switched off).")
    exit_code_without: int | None = Field(None, description="With [--compare]: the script's exit code without the pack.")
    step_ratio: float | None = Field(None, description="With [--compare]: step time without / with the pack, the "
                                     "median of interleaved pairs of steps; null when undetermined or no pack "
                                     "kernel ran (hits 0).")
    step_ratio_interval: list[float] | None = Field(None, description="With [--compare]: its 95% interval [low, high].")
    timing_status: Literal["ok", "undetermined"] | None = Field(None, description="With [--compare]: whether "
                                                                  "step_ratio is determined.")
    timing_reason: str = Field("", description="With [--compare]: why it is or is not determined.")
    outputs_match: bool | None = Field(None, description="With [--compare]: every output agrees within rtol/atol.")
    output_kind: str = ""
    outputs_with: list[float] = Field(default_factory=list)
    outputs_without: list[float] = Field(default_factory=list)
    max_output_difference: float | None = None
    environment_notes: list[str] = Field(default_factory=list)
    recorded: str | None = Field(None, description="Where this run was recorded (the stored pack's results).")
    script_output_tail: str = Field("", description="The last lines the script printed (at most 2000 characters).")
    left_out: list[LeftOut] = Field(default_factory=list, description="Lists cut to `limit` items.")
    script_file: str = Field("", description="The script that ran (resolved).")
    pack_file: str = Field("", description="The pack file used (resolved; a stored pack's pack.json).")


def hits_summary(hits: int, by_phase: dict[str, int], fallbacks: int) -> str:
    """``12 hits (4 backward, 8 forward), 3 fallbacks``, or the zero-hit line."""
    if hits == 0:
        return f"0 hits: no call used the pack ({fallbacks} fallbacks); no speedup claimed"
    phases = ", ".join(f"{n} {phase}" for phase, n in sorted(by_phase.items()) if n)
    return f"{hits} hits ({phases}), {fallbacks} fallbacks"


@tool
def run(req: RunRequest, ctx: ToolContext) -> RunResult:
    """Run a script with a pack: hits per phase, fallbacks, step times; with [--compare], vs no pack."""
    from modulelens.dispatch.pack import read_pack
    from modulelens.dispatch.script import ScriptRunRequest, outputs_agree, run_script, typical_step
    from modulelens.repo import Repository
    from modulelens.team.packs import pack_file

    script = input_script(req.script, ctx.project, "script")
    repo = Repository(ctx.repo_root)
    pack_path = pack_file(repo, req.pack, ctx.project)
    read_pack(pack_path, allow_env_mismatch=req.allow_env_mismatch, expect_sha256=req.expect_sha256)  # before the script
    base = ScriptRunRequest(script=str(script), script_args=req.script_args, workdir=str(ctx.project), pack=None,
                            allow_env_mismatch=req.allow_env_mismatch, expect_sha256=req.expect_sha256,
                            mechanism=req.mechanism)
    ctx.progress(0, 2 if req.compare else 1, f"running {script.name} with {req.pack}"
                 + (" (switched off in alternate steps)" if req.compare else ""))
    with_pack, tail = run_script(base.model_copy(update={"pack": str(pack_path), "toggle": req.compare}), req.timeout,
                                 progress=lambda m: ctx.progress(0, 2 if req.compare else 1, m),
                                 label=WITH_LABEL if req.compare else "",
                                 on_line=script_lines(ctx, 0, 2 if req.compare else 1, f"running {script.name} "
                                                     "with the pack"))
    report = with_pack.report
    assert report is not None
    by_phase: dict[str, int] = {}
    for e in report.entries:
        for phase, n in e.hits_by_phase.items():
            by_phase[phase] = by_phase.get(phase, 0) + n
    result = RunResult(summary=hits_summary(report.hits, by_phase, report.fallbacks), hits_by_phase=by_phase,
                       exit_code=with_pack.exit_code, script_error=with_pack.script_error, hits=with_pack.report.hits,
                       fallbacks=with_pack.report.fallbacks, mechanism=with_pack.report.mechanism,
                       entries=with_pack.report.entries, steps=len(with_pack.step_seconds),
                       step_kind=with_pack.step_kind, step_seconds_with=typical_step(with_pack.step_seconds),
                       output_kind=with_pack.output_kind, outputs_with=with_pack.outputs,
                       environment_notes=with_pack.report.environment_notes, script_output_tail=tail[-OUTPUT_TAIL_CHARS:],
                       script_file=str(script), pack_file=str(pack_path))
    if req.compare:
        compare_steps(result, with_pack.step_seconds, with_pack.step_pack_on)
        ctx.progress(1, 2, f"running {script.name} without the pack")
        without, _ = run_script(base, req.timeout, label=WITHOUT_LABEL,
                                on_line=script_lines(ctx, 1, 2, f"running {script.name} without the pack"))
        result.exit_code_without = without.exit_code
        result.outputs_without = without.outputs
        result.outputs_match, result.max_output_difference = outputs_agree(with_pack.outputs, without.outputs,
                                                                            req.rtol, req.atol)
    result.recorded = _record(repo, report, result, script.name)
    ctx.progress(2 if req.compare else 1, 2 if req.compare else 1, "done")
    advise_run(result, req)
    return keep_run_lists(result, req.limit)


def compare_steps(result: RunResult, seconds: list[float], pack_on: list[bool]) -> None:
    """Fill the with/without step times and the step ratio of ``result`` from a run whose pack was
    toggled between steps (see the module docstring). No pack kernel ran: no ratio is claimed."""
    from modulelens.dispatch.script import step_rounds
    from modulelens.timing import measurement_from_rounds, thread_choice

    without, with_ = step_rounds(seconds, pack_on)
    if with_:
        result.step_seconds_with, result.step_seconds_without = statistics.median(with_), statistics.median(without)
    if result.hits == 0:
        result.timing_status = "undetermined"
        result.timing_reason = "no pack kernel ran: nothing the pack could have sped up"
        return
    m = measurement_from_rounds(without, with_, target_width=0.2, threads=thread_choice(),
                                timer="time.perf_counter between optimizer steps (or model forwards) of the script",
                                method=f"{len(with_)} pairs of {result.step_kind}s, with and without the pack in "
                                       "alternating order in one process (warm-up steps left out)")
    result.step_ratio, result.step_ratio_interval = m.speedup, m.interval
    result.timing_status, result.timing_reason = m.status, m.reason


def advise_run(result: RunResult, req: RunRequest) -> None:
    """The warnings and next calls of a run: a pack that never ran (no speedup is claimed then),
    fallbacks, entries not used, a failed script, outputs that disagree."""
    warn = result.warnings
    if result.hits == 0:  # said first: nothing else in the result means anything without it
        warn.append("no pack kernel ran (0 hits): every packed call ran eager, so no speedup is claimed")
    if result.exit_code != 0:
        warn.append(f"the script failed with the pack (exit code {result.exit_code}): {result.script_error or 'see script_output_tail'}")
    unused = [e for e in result.entries if not e.dispatched]
    warn += [f"{e.candidate_id} was not used: {e.skip_reason}" for e in unused[:3]]
    reasons: dict[str, int] = {}
    for e in result.entries:
        for why, n in e.fallback_reasons.items():
            reasons[why] = reasons.get(why, 0) + n
    if result.fallbacks:
        top = ", ".join(f"{why} ({n})" for why, n in sorted(reasons.items(), key=lambda x: -x[1])[:3])
        warn.append(f"{result.fallbacks} packed call(s) fell back to eager" + (f": {top}" if top else ""))
    warn += result.environment_notes
    if req.compare and result.outputs_match is False:
        warn.append(f"outputs differ with and without the pack (max difference {result.max_output_difference})")
    if req.compare and result.hits > 0 and result.timing_status == "undetermined":
        warn.append(f"the step ratio is undetermined: {result.timing_reason}; run more steps (2 warm-up steps, "
                    "then pairs with and without the pack) or on a quieter machine")
    if not req.compare and result.hits > 0:
        result.next = [call("run", script=req.script, script_args=req.script_args or None, pack=req.pack,
                            compare=True)]
    elif result.hits == 0:
        result.next = [call("check_pack", pack=req.pack)]


def keep_run_lists(result: RunResult, limit: int | None) -> RunResult:
    """``result`` with at most ``limit`` (None: all) pack entries and outputs of each run."""
    again = "run again with a larger [--limit N]"
    for field in ("entries", "outputs_with", "outputs_without"):
        result = keep_first(result, field, limit, again)
    return result


def _record(repo, report, result: RunResult, script: str) -> str | None:
    """Record the run with the stored pack of the same content, if there is one."""
    from modulelens.dispatch.results import PackResultManifest, outcomes, record_result
    from modulelens.team.packs import stored_pack_for

    stored = stored_pack_for(repo, report.sha256)
    if stored is None:
        return None
    rec = PackResultManifest(pack=stored.ref, sha256=report.sha256, tool="run", subject=script,
                             ok=result.outputs_match, hits=result.hits, fallbacks=result.fallbacks,
                             summary=result.summary, entries=outcomes(report.entries))
    return record_result(repo, stored, report.sha256, rec).ref
