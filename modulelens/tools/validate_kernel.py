"""validate_kernel: check a candidate in a sandbox against real captured data: a kernel for an
operator card (against the card's samples), or a module-level ``ModelNew`` (KernelBench style)
against the capture of the module it replaces.

Which one is decided by what is given: a stored candidate knows its kind; with a source, a card id
as ``target`` (``blk/6``) means a kernel (``backend`` needed), a capture ref (``blk``) a module."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, Field

from modulelens.capture import KIND as CAPTURES
from modulelens.capture import capture_manifest
from modulelens.device import require
from modulelens.errors import ModuleLensError, tool_call
from modulelens.kernels import (
    CANDIDATES,
    BackendName,
    KernelSource,
    ModuleCandidate,
    ModuleTarget,
    candidate_manifest,
    is_module_candidate,
    load_candidate,
    load_module_candidate,
    operator_mismatch,
    read_source_file,
    save_agent_candidate,
    save_module_candidate,
)
from modulelens.listing import MAX_ITEMS, MAX_REPLY_CHARS, LeftOut
from modulelens.ops import open_card
from modulelens.paths import outside_warnings, source_file
from modulelens.registry import ToolContext, tool
from modulelens.replies import NextCall, ToolReply
from modulelens.repo import Artifact, Repository
from modulelens.sandbox import DEFAULT_MEMORY_LIMIT_MB
from modulelens.validation import (
    DEFAULT_TIMEOUT_S,
    REPORT_FILE,
    REPORTS,
    CandidateValidation,
    ValidationReport,
    ValidationSettings,
    brief_report,
    report_next,
    report_warnings,
    validate_candidate,
    validate_stored_module,
)


class ValidateKernelRequest(BaseModel):
    candidate: str | None = Field(None, description="Candidate id (blk.card6:v1).",
                                  json_schema_extra={"cli": "argument"})
    source: str | None = Field(None, description="Or: your source file.")
    source_text: str | None = Field(None, description="Or: the source itself.")
    allow_outside: bool = Field(False, description="Read or write a path outside the project and the repository.")
    target: str | None = Field(None, description="With source or source_text (not a candidate id): a card id "
                               "(blk/6: a kernel) or a capture (blk: a ModelNew).")
    backend: BackendName | None = Field(None, description="With a kernel source.")
    class_name: str = Field("ModelNew")
    claims_training: bool = Field(False, description="ModelNew: correct in training too.")
    device: str | None = Field(None, description="Default: the captured one.")
    time: bool = Field(True)
    compile_baseline: bool = Field(False, description="Also time torch.compile.")
    seeds: int = Field(2, ge=1, le=10, description="Fresh adversarial input seeds.")
    rtol: float | None = Field(None, ge=0, description="Default: per dtype.")
    atol: float | None = Field(None, ge=0, description="Default: per dtype.")
    timeout: float = Field(DEFAULT_TIMEOUT_S, gt=0, description="Seconds.")
    memory_limit_mb: int = Field(DEFAULT_MEMORY_LIMIT_MB, ge=256, le=262_144, description="Of the "
                                 "candidate process, MiB.")
    limit: int = Field(20, ge=1, le=MAX_ITEMS, description="Entries listed.")


def _source(req: ValidateKernelRequest, ctx: ToolContext) -> tuple[Path | None, str]:
    """(the file read, symlinks followed, or None for ``source_text``; the source's text)."""
    if not req.source:
        return None, req.source_text or ""
    path = source_file(req.source, ctx.project, ctx.repo_root, req.allow_outside or ctx.paths_typed_by_person)
    return path, read_source_file(path)  # named like a source, at most 1 MiB: no host file read over MCP


def _candidate(req: ValidateKernelRequest, repo: Repository, path: Path | None,
               text: str) -> tuple[Artifact, KernelSource]:
    given = [x for x in (req.candidate, req.source, req.source_text) if x]
    if len(given) != 1:
        raise ModuleLensError("give exactly one of a candidate id, [--source FILE] or [--source-text TEXT]",
                              "e.g. a candidate id such as blk.card6:v1, or [--source k.cpp] [--target blk/6] [--backend cpp]")
    if req.candidate:
        if req.target or req.backend:
            raise ModuleLensError("[--target] and [--backend] go with [--source] or [--source-text], not with a candidate id",
                                  "a stored candidate already knows its card and backend")
        return load_candidate(repo, req.candidate)
    if not req.target or not req.backend:
        raise ModuleLensError("[--source] needs [--target CARD] and [--backend BACKEND] (cpp, cuda or triton)",
                              "e.g. [--source k.cpp] [--target blk/6] [--backend cpp]")
    src = KernelSource(backend=req.backend, source=text, provider="agent",
                       provenance={"source_file": str(path) if path else None})
    _, card = open_card(repo, req.target)
    mismatch = operator_mismatch(card, src)
    if mismatch is not None:  # before anything is stored or compiled
        raise ModuleLensError(mismatch, "give the card of the operator the kernel is for as [--target CARD]; "
                              f"list the cards with {tool_call('list', kind='cards', of=card.card_id.rpartition('/')[0])}")
    return save_agent_candidate(repo, req.target, src), src


def _is_module(req: ValidateKernelRequest, repo: Repository) -> bool:
    """Whether the request is about a module-level candidate (see the module docstring)."""
    if req.candidate:
        return is_module_candidate(repo.open(CANDIDATES, req.candidate))
    return bool(req.target) and "/" not in (req.target or "") and req.backend is None


def _module_candidate(req: ValidateKernelRequest, repo: Repository, path: Path | None,
                      text: str) -> tuple[Artifact, ModuleCandidate, ModuleTarget]:
    if req.candidate:
        return load_module_candidate(repo, req.candidate)
    capture = repo.open(CAPTURES, req.target or "")
    manifest = capture_manifest(capture)
    target = ModuleTarget(capture=capture.ref, class_path=manifest.class_path, module_path=manifest.module_path)
    cand = ModuleCandidate(source=text, class_name=req.class_name, claims_training=req.claims_training,
                           provenance={"source_file": str(path) if path else None})
    return save_module_candidate(repo, target, capture, cand), cand, target


class ValidateModuleResult(ValidationReport, ToolReply):
    candidate_id: str
    target: str = Field(description="The capture validated against.")
    report: str = Field(description="Reference of the stored report.")
    source_file: str | None = Field(None, description="The file the source was read from (symlinks followed).")
    left_out: list[LeftOut] = Field(default_factory=list, description="Checks past `limit`, details of layers in "
                                    "force: the stored report has them.")


def _validate_module(req: ValidateKernelRequest, repo: Repository, ctx: ToolContext, path: Path | None,
                     text: str) -> ValidateModuleResult:
    art, cand, target = _module_candidate(req, repo, path, text)
    report, rep = validate_stored_module(repo, art, cand, target, device=req.device, time=req.time, seeds=req.seeds,
                                         rtol=req.rtol, atol=req.atol, timeout=req.timeout,
                                         memory_limit_mb=req.memory_limit_mb, progress=ctx.progress)
    result = ValidateModuleResult(**dict(report), candidate_id=art.ref, target=target.capture, report=rep.ref,
                                  source_file=str(path) if path else None,
                                  warnings=outside_warnings(path, ctx.project, ctx.repo_root) + report_warnings(report))
    result.next = report_next(report, art.ref, target.capture, str(path) if path else None, module=True,
                              timed=req.time)
    result.warnings += _source_again(result.next)
    return _brief(result, req, str(repo.open(REPORTS, rep.ref).file(REPORT_FILE)))


class ValidateKernelResult(CandidateValidation, ToolReply):
    # the validation's record (no docstring, so none in the JSON schema)
    source_file: str | None = Field(None, description="The file the source was read from (symlinks followed).")


R = TypeVar("R", ValidateKernelResult, ValidateModuleResult)


def _brief(reply: R, req: ValidateKernelRequest, full: str) -> R:
    """``reply`` cut to a size an agent reads (see :func:`modulelens.validation.brief.brief_report`):
    ``limit`` checks, and, unless ``limit`` was given, fewer when that is what keeps it within
    ``MAX_REPLY_CHARS`` (a validation under load notes more); ``left_out`` says what was cut and the
    stored report ``full`` has it all."""
    budget = None if "limit" in req.model_fields_set else MAX_REPLY_CHARS
    brief, cut = brief_report(reply, req.limit, full, budget=budget)
    return brief.model_copy(update={"left_out": [*reply.left_out, *cut]}) if cut else brief


def _source_again(calls: list[NextCall]) -> list[str]:
    """The warning for a suggested validation of fixed code that was given as text: no file can
    be named, so the caller gives the fixed text."""
    if any(c.tool == "validate_kernel" and "target" in c.arguments and "source" not in c.arguments for c in calls):
        return ["fix the source and validate it again, giving the fixed text as [--source-text TEXT]"]
    return []


@tool
def validate_kernel(req: ValidateKernelRequest, ctx: ToolContext) -> ValidateKernelResult | ValidateModuleResult:
    """Validate a card's kernel or a capture's ModelNew in a sandbox, on real and adversarial inputs, timed vs
    eager."""
    if req.device is not None:
        require(req.device)  # before a candidate is stored or a worker started
    repo = Repository(ctx.repo_root)
    path, text = _source(req, ctx)
    if len([x for x in (req.candidate, req.source, req.source_text) if x]) == 1 and _is_module(req, repo):
        return _validate_module(req, repo, ctx, path, text)
    if req.claims_training or req.class_name != "ModelNew":
        raise ModuleLensError("[--class-name] and [--claims-training] go with a ModelNew, not a kernel",
                              "for a ModelNew give [--target CAPTURE] (a capture ref such as blk) and no backend")
    art, src = _candidate(req, repo, path, text)
    settings = ValidationSettings(card_id=candidate_manifest(art).target.card_id, device=req.device, time=req.time,
                                  compile_baseline=req.compile_baseline, seeds=list(range(req.seeds)),
                                  rtol=req.rtol, atol=req.atol)
    result = validate_candidate(repo, art, src, settings, timeout=req.timeout, memory_limit_mb=req.memory_limit_mb,
                                progress=ctx.progress)
    reply = ValidateKernelResult(**dict(result), source_file=str(path) if path else None,
                                 warnings=outside_warnings(path, ctx.project, ctx.repo_root) + report_warnings(result),
                                 next=report_next(result, result.candidate_id, result.target,
                                                  str(path) if path else None, provider=src.provider,
                                                  timed=req.time))
    reply.warnings += _source_again(reply.next)
    return _brief(reply, req, str(repo.open(REPORTS, result.report).file(REPORT_FILE)))
