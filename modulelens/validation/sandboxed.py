"""The caller's side of the sandbox: validate or time a stored candidate in a worker process and
turn the worker's answer (or its death) into a report or a timing.

Candidates are untrusted code: they run only in :mod:`modulelens.sandbox` workers, never here."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from modulelens.callbacks import ProgressFn
from modulelens.cancellation import CallCancelled
from modulelens.device import require
from modulelens.errors import ModuleLensError
from modulelens.kernels import KernelSource, candidate_manifest, default_build_dir
from modulelens.listing import LeftOut
from modulelens.ops import open_card
from modulelens.repo import KEY_FILE, Artifact, Repository, config_dir, require_trusted, verified_digest
from modulelens.sandbox import DEFAULT_MEMORY_LIMIT_MB, SandboxPool, shared_pool
from modulelens.timing import Timing
from modulelens.validation.edge_cases import ensure_opinfo_values, opinfo_cache_dir
from modulelens.validation.messages import (
    VALIDATION_WORKER,
    Confinement,
    CrashedResult,
    InternalErrorResult,
    RefusedResult,
    RemeasuredResult,
    RemeasureTask,
    SandboxResult,
    SandboxTask,
    TimeCandidateTask,
    TimedResult,
    TrustedInput,
    ValidateCardTask,
    ValidatedResult,
)
from modulelens.validation.report import ModuleValidationSettings, ValidationReport, ValidationSettings
from modulelens.validation.stored_reports import save_report

VALIDATION_STAGES = ("compile", "check", "time", "recheck", "denial", "done")
CHECKER_SLACK_S = 120.0  # seconds the checker may take beyond the candidate's own time limit
DEFAULT_TIMEOUT_S = 900.0  # seconds a task may take (cold C++ builds take ~20-60 s)


class CandidateValidation(ValidationReport):
    """A validation report as stored for a candidate."""

    candidate_id: str
    target: str = Field(description="The card validated against.")
    report: str = Field(description="Reference of the stored report.")
    left_out: list[LeftOut] = Field(default_factory=list, description="Checks past `limit`, details of layers in "
                                    "force: the stored report has them.")


def pool() -> SandboxPool:
    """The process's shared pool of validation workers."""
    return shared_pool(VALIDATION_WORKER)


def new_pool() -> SandboxPool:
    """A pool of validation workers of its own (a search gives each of its workers one)."""
    return SandboxPool(VALIDATION_WORKER)


def _no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    pass


def confinement(repo: Repository, inputs: list[Artifact], action: str, readable: list[Path] | None = None) -> Confinement:
    """What the checker of a task may reach: the ``inputs`` artifacts (each checked trusted here,
    with this machine's key, which the checker never holds -- refused with ``action`` named
    otherwise -- and named by the sha256 of its manifest's bytes), the ``readable`` folders, and the
    secrets it must prove it cannot open (the signing key, the repository)."""
    checked = []
    for art in inputs:
        digest = verified_digest(art.path)
        require_trusted(art, action)
        checked.append(TrustedInput(path=str(art.path), manifest_sha256=digest))
    return Confinement(inputs=checked, readable=[str(p) for p in readable or []],
                       secrets={"the signing key": str(config_dir() / KEY_FILE), "the repository": str(repo.root)})


def validate_candidate(repo: Repository, candidate: Artifact, src: KernelSource, settings: ValidationSettings, *,
                       timeout: float, memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
                       progress: ProgressFn = _no_progress, sandbox: SandboxPool | None = None) -> CandidateValidation:
    """Validate the stored ``candidate`` (source ``src``) against ``settings.card_id`` in a sandbox
    worker, store the report as a new version of the candidate's report, and return it. A worker
    that crashes or outlives ``timeout`` seconds makes a ``rejected`` report. ``sandbox`` picks the
    worker pool (default: the process's shared one); a search gives each of its workers its own.
    A cancelled call stores an interrupted report (see :func:`interrupted_report`) before
    CallCancelled goes on up (:func:`validate_in_sandbox`)."""
    card_artifact, card = open_card(repo, settings.card_id)  # a clear error if the card is gone
    require(settings.device or card.device)  # refused here, before a worker starts
    # decoding samples resolves class paths: trusted cards only, checked here where the key is
    ensure_opinfo_values(card.op)  # the checker reads the cached OpInfo samples; it cannot make them
    confine = confinement(repo, [card_artifact], "validate against its cards", readable=[opinfo_cache_dir()])
    task = ValidateCardTask(repo=str(repo.root), candidate=src, build_dir=str(default_build_dir()),
                            memory_limit_mb=memory_limit_mb, call_timeout=timeout, build_timeout=timeout,
                            confinement=confine, **{**settings.model_dump(), "card_id": card.card_id})
    # the candidate process has ``timeout`` per request; the checker a little more for its own work
    report, stored = validate_in_sandbox(repo, candidate, task, settings, backend=src.backend,
                                         timeout=timeout + CHECKER_SLACK_S, memory_limit_mb=memory_limit_mb,
                                         progress=progress, sandbox=sandbox)
    return CandidateValidation(**report.model_dump(), candidate_id=candidate.ref, target=settings.card_id,
                               report=stored.ref)


def validate_in_sandbox(repo: Repository, candidate: Artifact, task: SandboxTask,
                        settings: ValidationSettings | ModuleValidationSettings, *, backend: str, timeout: float,
                        memory_limit_mb: int | None = None, progress: ProgressFn = _no_progress,
                        sandbox: SandboxPool | None = None) -> tuple[ValidationReport, Artifact]:
    """Run the validation ``task`` of the stored ``candidate`` in a sandbox worker (``timeout``
    seconds; ``memory_limit_mb`` for the worker, default the pool's), reporting each stage as
    progress, and store its report (made with ``settings``) as a new version of the candidate's
    report. Returns (report, stored report). A cancelled call stores an interrupted report (see
    :func:`interrupted_report`) before CallCancelled goes on up, so the candidate never lacks a
    report for its last validation."""
    progress(0, len(VALIDATION_STAGES), f"validating {candidate.ref} in a sandbox")
    reached = ["starting"]

    def on_stage(stage: str) -> None:
        reached.append(stage)
        done = VALIDATION_STAGES.index(stage) + 1 if stage in VALIDATION_STAGES else 0
        progress(done, len(VALIDATION_STAGES), stage)

    try:
        result = (sandbox or pool()).run(task, timeout, memory_limit_mb, on_stage=on_stage)
    except CallCancelled:
        save_report(repo, candidate, interrupted_report(reached[-1], backend), settings)
        raise
    report = validation_report(result, backend)
    stored = save_report(repo, candidate, report, settings)
    progress(len(VALIDATION_STAGES), len(VALIDATION_STAGES), report.verdict)
    return report, stored


def interrupted_report(stage: str, backend: str) -> ValidationReport:
    """The report of a validation its caller cancelled during ``stage``: rejected, flagged
    ``interrupted``, saying so in its reason."""
    return ValidationReport(
        verdict="rejected", correct=False, stage=stage, backend=backend, flags=["interrupted"],
        reason=f"interrupted: the validation was cancelled during {stage}; validate the candidate again",
        errors=[f"interrupted during {stage}"],
    )


def validation_report(result: SandboxResult, backend: str) -> ValidationReport:
    """The report a validation task's result amounts to: the worker's own report (rejected when the
    candidate wrote to stdout), or a rejection when the worker died. A refusal (the validation
    could not be done here: too little memory, ...) and an internal error are raised."""
    match result:
        case RefusedResult():  # the validation could not be done here (not enough memory, ...): no verdict
            raise ModuleLensError(result.message, result.hint)
        case ValidatedResult():
            # bytes the candidate process wrote (counted by the checker) plus any the checker's own worker wrote
            report = result.report.model_copy(update={"stdout_bytes": result.report.stdout_bytes + result.stdout_bytes})
            if report.stdout_bytes:
                report.verdict, report.correct = "rejected", False
                report.reason = (f"wrote {report.stdout_bytes} bytes to stdout: kernels must not print "
                                 "(it would corrupt an MCP stdio session)")
            return report
        case CrashedResult():
            stage = result.stage or "starting"
            report = ValidationReport(
                verdict="rejected", correct=False, stage=stage, backend=backend,
                reason=f"the sandbox worker {result.reason} during {stage}", stderr_tail=result.stderr_tail,
                errors=[f"worker {result.reason} during {stage}"],
            )
            if "memory" in result.stderr_tail.lower() or "bad_alloc" in result.stderr_tail:
                report.reason += " (out of memory)"
            return report
    raise _unexpected(result, "a validation")


def time_candidate(repo: Repository, candidate: Artifact, src: KernelSource, *, device: str | None,
                   min_run_time: float, warmup: int) -> Timing:
    """Time the stored ``candidate`` on its card's first sample, in a sandbox worker."""
    card_id = candidate_manifest(candidate).target.card_id
    card_artifact, card = open_card(repo, card_id)
    require(device or card.device)
    task = TimeCandidateTask(repo=str(repo.root), candidate=src, build_dir=str(default_build_dir()), card_id=card.card_id,
                             device=device, min_run_time=min_run_time, warmup=warmup,
                             confinement=confinement(repo, [card_artifact], "time a candidate on its cards"))
    result = pool().run(task, timeout=DEFAULT_TIMEOUT_S)
    match result:
        case TimedResult():
            return result.timing
        case CrashedResult():
            raise ModuleLensError(f"the candidate's sandbox worker {result.reason} while timing it",
                                  "validate it first: validate-kernel " + candidate.ref)
        case RefusedResult():
            raise ModuleLensError(result.message, result.hint)
    raise _unexpected(result, "timing")


def remeasure_candidates(repo: Repository, card_id: str, sources: list[KernelSource], *, min_run_time: float,
                         timing_budget_s: float, device: str | None = None,
                         sandbox: SandboxPool | None = None) -> RemeasuredResult:
    """Time validated candidates of ``card_id`` against eager together, interleaved, in a sandbox
    worker (optimize's finalists; see :mod:`modulelens.validation.remeasure`)."""
    card_artifact, card = open_card(repo, card_id)
    task = RemeasureTask(repo=str(repo.root), card_id=card.card_id, candidates=sources,
                         build_dir=str(default_build_dir()), device=device, min_run_time=min_run_time,
                         timing_budget_s=timing_budget_s,
                         confinement=confinement(repo, [card_artifact], "re-measure candidates on its cards"))
    result = (sandbox or pool()).run(task, timeout=DEFAULT_TIMEOUT_S + CHECKER_SLACK_S)
    match result:
        case RemeasuredResult():
            return result
        case CrashedResult():
            why = f"the sandbox worker {result.reason} while re-measuring the finalists"
            return RemeasuredResult(measurements=[None] * len(sources), reasons=[why] * len(sources))
    raise _unexpected(result, "a re-measurement")


def _unexpected(result: SandboxResult, task: str) -> ModuleLensError:
    if isinstance(result, InternalErrorResult):
        return ModuleLensError(f"internal error in the sandbox worker: {result.error}",
                               "please report it with this traceback: " + result.traceback[-1000:])
    return ModuleLensError(f"internal error: the sandbox answered {task} with a {result.kind} result",
                           "please report it")
