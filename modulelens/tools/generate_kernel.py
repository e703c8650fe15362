"""generate_kernel: ask a provider for a candidate kernel for an operator card and store it."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.kernels.candidates import latest_report, load_candidate, save_candidate
from modulelens.kernels.source import BackendName
from modulelens.ops.cards import open_card
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class GenerateKernelRequest(BaseModel):
    card: str = Field(description="Operator card id (blk/6 or blk:v1/6).", json_schema_extra={"cli": "argument"})
    backend: BackendName = Field("cpp", description="cpp (runs on any CPU), triton or cuda.")
    provider: str = Field("template", description="template (built-in, offline), anthropic (API) or sampling (MCP client's model).")
    parent: str | None = Field(None, description="A candidate id to repair or improve: its source and latest report go to the provider.")
    instructions: str | None = Field(None, description="Extra guidance for LLM providers.")
    variant: int = Field(0, ge=0, description="Template parameter variant (block sizes, ...).")
    validate_now: bool = Field(False, description="Validate the new candidate right away (same as validate-kernel).")


class GenerateKernelResult(BaseModel):
    candidate_id: str = Field(description="Use with validate-kernel.")
    card: str
    backend: str
    provider: str
    family: str | None = None
    params: dict = Field(default_factory=dict)
    source_path: str
    source_sha256: str
    provenance: dict = Field(default_factory=dict)
    validation: dict | None = Field(None, description="The validation result when validate_now was set.")


def generate_kernel(req: GenerateKernelRequest, ctx: ToolContext) -> GenerateKernelResult:
    from modulelens.providers.base import GenerationRequest, get_provider

    repo = Repository(ctx.repo_root)
    art, card = open_card(repo, req.card)
    card_id = f"{art.ref}/{card['index']}"
    card = {**card, "card_id": card_id}
    parent_src, parent_report = None, None
    if req.parent:
        parent_art, parent_src = load_candidate(repo, req.parent)
        rep = latest_report(repo, parent_art)
        parent_report = rep.model_dump(mode="json") if rep else None
    provider = get_provider(req.provider)
    ctx.progress(0, 1, f"asking the {req.provider} provider for a {req.backend} kernel for {card['op']}")
    src = provider.generate(
        GenerationRequest(card=card, backend=req.backend, parent=parent_src, parent_report=parent_report,
                          instructions=req.instructions, variant=req.variant), ctx)
    cand = save_candidate(repo, card_id, card, src, parent=req.parent)
    result = GenerateKernelResult(
        candidate_id=cand.ref, card=card_id, backend=src.backend, provider=src.provider, family=src.family,
        params=src.params, source_path=str(cand.path / cand.manifest["source_file"]), source_sha256=src.sha256,
        provenance=src.provenance,
    )
    if req.validate_now:
        from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

        result.validation = validate_kernel(ValidateKernelRequest(candidate=cand.ref), ctx).model_dump(mode="json")
    ctx.progress(1, 1, cand.ref)
    return result


def _render(r: GenerateKernelResult):
    from rich.markup import escape

    text = escape(f"{r.candidate_id}: {r.backend} kernel for {r.card} from {r.provider}"
                  + (f" (template {r.family}, {r.params})" if r.family else "") + f"\nsource: {r.source_path}")
    if r.validation:
        text += escape(f"\nvalidation: {r.validation['verdict']}: {r.validation['reason']}")
    return text


TOOL = register(
    Tool(
        name="generate_kernel",
        request=GenerateKernelRequest,
        result=GenerateKernelResult,
        fn=generate_kernel,
        summary="Generate a candidate kernel (cpp, triton or cuda) for an operator card with a provider: template "
        "(built-in library), anthropic (API) or sampling (the MCP client's model); a parent candidate and its report "
        "can be passed for repair or improvement. Stores the candidate with its provenance.",
        render=_render,
    )
)
