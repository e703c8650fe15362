"""validate_kernel: check a candidate kernel in a sandbox against its operator card's real data."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError
from modulelens.kernels.backends.base import default_build_dir
from modulelens.kernels.candidates import load_candidate, save_candidate, save_report
from modulelens.kernels.report import ValidationReport
from modulelens.kernels.source import BackendName, KernelSource
from modulelens.ops.cards import open_card
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.sandbox.pool import DEFAULT_MEMORY_LIMIT_MB, pool


class ValidateKernelRequest(BaseModel):
    candidate: str | None = Field(None, description="Candidate id from generate_kernel (e.g. blk.card6:v1).",
                                  json_schema_extra={"cli": "argument"})
    source: str | None = Field(None, description="Instead of a candidate id: a file with your own kernel source.")
    source_text: str | None = Field(None, description="Instead of a file: the kernel source itself (for agents).")
    target: str | None = Field(None, description="With source/source_text: the card id it implements (blk/6).")
    backend: BackendName | None = Field(None, description="With source/source_text: cpp, cuda or triton.")
    device: str | None = Field(None, description="Device to validate on (default: the card's; CPU when no GPU).")
    time: bool = Field(True, description="Time against eager on the captured sample (when the backend can be timed here).")
    compile_baseline: bool = Field(False, description="Also time torch.compile of the operator.")
    seeds: int = Field(2, ge=1, le=10, description="Fresh-input seeds (each with normal, uniform, heavy-tailed and special values).")
    rtol: float | None = Field(None, description="Override the relative tolerance (default: per dtype).")
    atol: float | None = Field(None, description="Override the absolute tolerance (default: per dtype, scaled by the output).")
    timeout: float = Field(900.0, gt=0, description="Seconds before the sandbox worker is stopped (cold C++ builds take ~20-60 s).")
    memory_limit_mb: int = Field(DEFAULT_MEMORY_LIMIT_MB, ge=256, description="Address-space limit of the sandbox worker (CPU).")


class ValidateKernelResult(ValidationReport):
    candidate_id: str
    target: str = Field(description="The card validated against.")
    report: str = Field(description="Reference of the stored report.")


def _candidate(req: ValidateKernelRequest, repo: Repository):
    given = [x for x in (req.candidate, req.source, req.source_text) if x]
    if len(given) != 1:
        raise ModuleLensError("give exactly one of a candidate id, --source FILE or --source-text",
                              "e.g. validate-kernel blk.card6:v1, or validate-kernel --source k.cpp --target blk/6 --backend cpp")
    if req.candidate:
        if req.target or req.backend:
            raise ModuleLensError("--target and --backend go with --source, not with a candidate id",
                                  "a stored candidate already knows its card and backend")
        return load_candidate(repo, req.candidate)
    if not req.target or not req.backend:
        raise ModuleLensError("--source needs --target CARD and --backend cpp|cuda|triton",
                              "e.g. validate-kernel --source k.cpp --target blk/6 --backend cpp")
    text = req.source_text
    if req.source:
        path = Path(req.source).expanduser()
        if not path.is_file():
            raise ModuleLensError(f"source file {req.source!r} does not exist", "give the path of your kernel file")
        text = path.read_text()
    art_card, card = open_card(repo, req.target)
    card_id = f"{art_card.ref}/{card['index']}"
    src = KernelSource(backend=req.backend, source=text or "", provider="agent",
                       provenance={"source_file": str(Path(req.source).resolve()) if req.source else None})
    art = save_candidate(repo, card_id, card, src)
    return art, src


def validate_kernel(req: ValidateKernelRequest, ctx: ToolContext) -> ValidateKernelResult:
    repo = Repository(ctx.repo_root)
    cand_art, src = _candidate(req, repo)
    card_id = cand_art.manifest["target"]["card_id"]
    open_card(repo, card_id)  # clear error if the card is gone
    task = {
        "kind": "validate_card", "repo": str(repo.root), "card_id": card_id, "candidate": src.model_dump(),
        "build_dir": str(default_build_dir()), "device": req.device, "time": req.time,
        "compile_baseline": req.compile_baseline, "seeds": list(range(req.seeds)), "rtol": req.rtol, "atol": req.atol,
    }
    ctx.progress(0, 5, f"validating {cand_art.ref} in a sandbox")
    stages = ["compile", "check", "time", "recheck", "done"]
    result = pool().run(task, req.timeout, req.memory_limit_mb,
                        on_stage=lambda s: ctx.progress(stages.index(s) + 1 if s in stages else 0, 5, s))
    if "crashed" in result:
        stage = result.get("stage") or "starting"
        report = ValidationReport(
            verdict="rejected", correct=False, stage=stage, backend=src.backend,
            reason=f"the sandbox worker {result['crashed']} during {stage}", stderr_tail=result.get("stderr_tail", ""),
            errors=[f"worker {result['crashed']} during {stage}"],
        )
        if "memory" in result.get("stderr_tail", "").lower() or "bad_alloc" in result.get("stderr_tail", ""):
            report.reason += " (out of memory)"
    elif "internal_error" in result:
        raise ModuleLensError(f"internal error in the sandbox worker: {result['internal_error']}",
                              "please report it with this traceback: " + result.get("traceback", "")[-1000:])
    else:
        report = ValidationReport.model_validate(result["report"])
        report.stdout_bytes = result.get("stdout_bytes", 0)
        if report.stdout_bytes:
            report.verdict, report.correct = "rejected", False
            report.reason = (f"wrote {report.stdout_bytes} bytes to stdout: kernels must not print "
                             "(it would corrupt an MCP stdio session)")
    settings = {k: v for k, v in task.items() if k not in ("candidate", "repo", "build_dir")}
    rep = save_report(repo, cand_art, report, settings)
    ctx.progress(5, 5, report.verdict)
    return ValidateKernelResult(**report.model_dump(), candidate_id=cand_art.ref, target=card_id, report=rep.ref)


def render_report(r: ValidateKernelResult):
    from rich.markup import escape

    color = {"custom": "green", "wrapper": "yellow", "rejected": "red"}[r.verdict]
    lines = [f"[bold {color}]{r.verdict}[/] {escape(r.candidate_id)} for {escape(r.target)} ({r.backend}): {escape(r.reason)}"]
    if r.speedup_vs_eager is not None and r.eager and r.candidate:
        lines.append(f"speedup vs eager {r.speedup_vs_eager:.2f}x (eager {r.eager.median_s * 1e6:.1f} us "
                     f"[{r.eager.p20_s * 1e6:.1f}-{r.eager.p80_s * 1e6:.1f}], candidate {r.candidate.median_s * 1e6:.1f} us "
                     f"[{r.candidate.p20_s * 1e6:.1f}-{r.candidate.p80_s * 1e6:.1f}], p20-p80)")
    if r.speedup_vs_compile is not None:
        lines.append(f"speedup vs torch.compile {r.speedup_vs_compile:.2f}x")
    if r.timing_note:
        lines.append(escape(f"timing: {r.timing_note}"))
    passed = sum(c.passed for c in r.checks)
    lines.append(f"checks: {passed}/{len(r.checks)} passed; stage reached: {r.stage}")
    lines += [escape(f"flag: {f}") for f in r.flags] + [escape(f"error: {e}") for e in r.errors[:3]]
    return "\n".join(lines)


TOOL = register(
    Tool(
        name="validate_kernel",
        request=ValidateKernelRequest,
        result=ValidateKernelResult,
        fn=validate_kernel,
        summary="Validate a candidate kernel (stored candidate, or your own source with a target card and backend) "
        "in a sandbox worker: compiles, runs, matches the card's captured samples and fresh adversarial inputs, "
        "does not mutate inputs or alias them, times against eager; verdict custom, wrapper or rejected with the reason.",
        render=render_report,
    )
)
