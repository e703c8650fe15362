"""validate_kernel: check a candidate kernel in a sandbox against its operator card's real data."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError
from modulelens.kernels.candidates import candidate_manifest, load_candidate, save_agent_candidate
from modulelens.kernels.source import BackendName, KernelSource, read_source_file
from modulelens.listing import keep_first
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Artifact, Repository
from modulelens.sandbox.pool import DEFAULT_MEMORY_LIMIT_MB
from modulelens.validation.report import ValidationSettings
from modulelens.validation.sandboxed import DEFAULT_TIMEOUT_S, CandidateValidation, validate_candidate
from modulelens.validation.stored_reports import REPORT_FILE, REPORTS


class ValidateKernelRequest(BaseModel):
    candidate: str | None = Field(None, description="Candidate id (blk.card6:v1).",
                                  json_schema_extra={"cli": "argument"})
    source: str | None = Field(None, description="Or: your kernel source file.")
    source_text: str | None = Field(None, description="Or: the source itself.")
    target: str | None = Field(None, description="With a source: its card id.")
    backend: BackendName | None = Field(None, description="With a source.")
    device: str | None = Field(None, description="Default: the card's.")
    time: bool = Field(True, description="Time against eager.")
    compile_baseline: bool = Field(False, description="Also time torch.compile.")
    seeds: int = Field(2, ge=1, le=10, description="Fresh adversarial input seeds.")
    rtol: float | None = Field(None, ge=0, description="Default: per dtype.")
    atol: float | None = Field(None, ge=0, description="Default: per dtype.")
    timeout: float = Field(DEFAULT_TIMEOUT_S, gt=0, description="Seconds (cold C++ builds: 20-60 s).")
    memory_limit_mb: int = Field(DEFAULT_MEMORY_LIMIT_MB, ge=256)
    limit: int | None = Field(20, ge=1, description="Entries listed (null: all).")


def _candidate(req: ValidateKernelRequest, repo: Repository) -> tuple[Artifact, KernelSource]:
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
    text = req.source_text
    if req.source:
        path = Path(req.source).expanduser()
        if not path.is_file():
            raise ModuleLensError(f"source file {req.source!r} does not exist", "give the path of your kernel file")
        text = read_source_file(path)
    src = KernelSource(backend=req.backend, source=text or "", provider="agent",
                       provenance={"source_file": str(Path(req.source).resolve()) if req.source else None})
    return save_agent_candidate(repo, req.target, src), src


def validate_kernel(req: ValidateKernelRequest, ctx: ToolContext) -> CandidateValidation:
    repo = Repository(ctx.repo_root)
    art, src = _candidate(req, repo)
    settings = ValidationSettings(card_id=candidate_manifest(art).target.card_id, device=req.device, time=req.time,
                                  compile_baseline=req.compile_baseline, seeds=list(range(req.seeds)),
                                  rtol=req.rtol, atol=req.atol)
    result = validate_candidate(repo, art, src, settings, timeout=req.timeout, memory_limit_mb=req.memory_limit_mb,
                                progress=ctx.progress)
    return keep_first(result, "checks", req.limit, str(repo.open(REPORTS, result.report).file(REPORT_FILE)))


TOOL = register(
    Tool(
        name="validate_kernel",
        request=ValidateKernelRequest,
        result=CandidateValidation,
        fn=validate_kernel,
        summary="Validate a kernel in a sandbox (captured and adversarial inputs, no mutation or aliasing, timed vs eager).",
    )
)
