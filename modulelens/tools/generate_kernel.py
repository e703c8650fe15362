"""generate_kernel: ask a provider for a candidate kernel for an operator card and store it."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.kernels import BackendName, candidate_manifest, load_candidate
from modulelens.providers.generation import generate_candidate
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import Repository
from modulelens.validation import (
    DEFAULT_TIMEOUT_S,
    CandidateValidation,
    ValidationSettings,
    latest_report,
    report_next,
    report_warnings,
    validate_candidate,
)


class GenerateKernelRequest(BaseModel):
    card: str = Field(description="Card id (blk/6).", json_schema_extra={"cli": "argument"})
    backend: BackendName = Field("cpp", description="cpp runs on any CPU.")
    provider: str = Field("template", description="template (offline), anthropic (API) or sampling (your model).")
    parent: str | None = Field(None, description="Candidate to repair or improve.")
    instructions: str | None = Field(None, description="For LLM providers.")
    variant: int = Field(0, ge=0, description="Template variant.")
    validate_now: bool = Field(False)


class GenerateKernelResult(ToolReply):
    candidate_id: str = Field(description="Use with validate-kernel.")
    card: str
    backend: str
    provider: str
    family: str | None = None
    params: dict = Field(default_factory=dict)
    source_path: str
    source_sha256: str
    provenance: dict = Field(default_factory=dict)
    validation: CandidateValidation | None = Field(None, description="The validation result when validate_now was set.")


@tool
def generate_kernel(req: GenerateKernelRequest, ctx: ToolContext) -> GenerateKernelResult:
    """Generate a candidate kernel for a card (or repair/improve a parent)."""
    repo = Repository(ctx.repo_root)
    parent_report = None
    if req.parent:
        report = latest_report(repo, load_candidate(repo, req.parent)[0])
        parent_report = report.model_dump(mode="json") if report else None
    cand, src = generate_candidate(repo, req.card, req.backend, req.provider, ctx, parent=req.parent,
                                   parent_report=parent_report, instructions=req.instructions, variant=req.variant, progress=ctx.progress)
    m = candidate_manifest(cand)
    result = GenerateKernelResult(
        candidate_id=cand.ref, card=m.target.card_id, backend=src.backend, provider=src.provider, family=src.family,
        params=src.params, source_path=str(cand.path / m.source_file), source_sha256=src.sha256,
        provenance=src.provenance,
    )
    if req.validate_now:
        result.validation = validate_candidate(repo, cand, src, ValidationSettings(card_id=m.target.card_id),
                                               timeout=DEFAULT_TIMEOUT_S, progress=ctx.progress)
    ctx.progress(1, 1, cand.ref)
    if result.validation is None:
        result.next = [call("validate_kernel", candidate=cand.ref)]
    else:
        result.warnings = report_warnings(result.validation)
        result.next = report_next(result.validation, cand.ref, result.card, provider=src.provider, timed=True)
    return result
