"""validate_kernel: check a candidate kernel in a sandbox against its operator card's real data."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError
from modulelens.kernels.candidates import candidate_manifest, load_candidate, save_agent_candidate
from modulelens.kernels.report import ValidationSettings
from modulelens.kernels.sandboxed import DEFAULT_TIMEOUT_S, CandidateValidation, validate_candidate
from modulelens.kernels.source import BackendName, KernelSource
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Artifact, Repository
from modulelens.sandbox.pool import DEFAULT_MEMORY_LIMIT_MB


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
    timeout: float = Field(DEFAULT_TIMEOUT_S, gt=0, description="Seconds before the sandbox worker is stopped (cold C++ builds take ~20-60 s).")
    memory_limit_mb: int = Field(DEFAULT_MEMORY_LIMIT_MB, ge=256, description="Address-space limit of the sandbox worker (CPU).")


def _candidate(req: ValidateKernelRequest, repo: Repository) -> tuple[Artifact, KernelSource]:
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
    src = KernelSource(backend=req.backend, source=text or "", provider="agent",
                       provenance={"source_file": str(Path(req.source).resolve()) if req.source else None})
    return save_agent_candidate(repo, req.target, src), src


def validate_kernel(req: ValidateKernelRequest, ctx: ToolContext) -> CandidateValidation:
    repo = Repository(ctx.repo_root)
    art, src = _candidate(req, repo)
    settings = ValidationSettings(card_id=candidate_manifest(art).target.card_id, device=req.device, time=req.time,
                                  compile_baseline=req.compile_baseline, seeds=list(range(req.seeds)),
                                  rtol=req.rtol, atol=req.atol)
    return validate_candidate(repo, art, src, settings, timeout=req.timeout, memory_limit_mb=req.memory_limit_mb,
                              progress=ctx.progress)


TOOL = register(
    Tool(
        name="validate_kernel",
        request=ValidateKernelRequest,
        result=CandidateValidation,
        fn=validate_kernel,
        summary="Validate a candidate kernel (stored candidate, or your own source with a target card and backend) "
        "in a sandbox worker: compiles, runs, matches the card's captured samples and fresh adversarial inputs, "
        "does not mutate inputs or alias them, times against eager; verdict custom, wrapper or rejected with the reason.",
    )
)
