"""validate_module: check a module-level candidate (KernelBench ModelNew) in a sandbox against its capture."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError
from modulelens.kernels.module_candidates import (
    ModuleCandidate,
    ModuleTarget,
    load_module_candidate,
    save_module_candidate,
)
from modulelens.kernels.source import read_source_file
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.sandbox.pool import DEFAULT_MEMORY_LIMIT_MB
from modulelens.validation.module_runs import validate_stored_module
from modulelens.validation.report import ValidationReport


class ValidateModuleRequest(BaseModel):
    candidate: str | None = Field(None, description="Module candidate id (blk.module:v1).",
                                  json_schema_extra={"cli": "argument"})
    source: str | None = Field(None, description="Or: a file defining ModelNew.")
    source_text: str | None = Field(None, description="Or: the source itself.")
    target: str | None = Field(None, description="With a source: the capture it replaces.")
    class_name: str = Field("ModelNew")
    claims_training: bool = Field(False, description="Correct in training mode too (checked, then dispatched in training).")
    time: bool = Field(True, description="Time against the original.")
    seeds: int = Field(2, ge=1, le=10, description="Fresh adversarial input seeds.")
    rtol: float | None = Field(None, ge=0, description="Default: per dtype.")
    atol: float | None = Field(None, ge=0, description="Default: per dtype.")
    timeout: float = Field(900.0, gt=0, description="Seconds.")
    memory_limit_mb: int = Field(DEFAULT_MEMORY_LIMIT_MB, ge=256)


class ValidateModuleResult(ValidationReport):
    candidate_id: str
    target: str = Field(description="The capture validated against.")
    report: str = Field(description="Reference of the stored report.")


def _candidate(req: ValidateModuleRequest, repo: Repository):
    given = [x for x in (req.candidate, req.source, req.source_text) if x]
    if len(given) != 1:
        raise ModuleLensError("give exactly one of a module candidate id, [--source FILE] or [--source-text TEXT]",
                              "e.g. [--source fused_block.py] [--target blk] [--claims-training]")
    if req.candidate:
        return load_module_candidate(repo, req.candidate)
    if not req.target:
        raise ModuleLensError("[--source] needs [--target CAPTURE]", "the capture of the module it replaces, e.g. [--target blk]")
    text = req.source_text
    if req.source:
        path = Path(req.source).expanduser()
        if not path.is_file():
            raise ModuleLensError(f"source file {req.source!r} does not exist", "give the path of your ModelNew file")
        text = read_source_file(path)  # .py and friends only, at most 1 MiB: no host file read over MCP
    from modulelens.capture.manifest import capture_manifest

    capture = repo.open("captures", req.target)
    manifest = capture_manifest(capture)
    target = ModuleTarget(capture=capture.ref, class_path=manifest.class_path, module_path=manifest.module_path)
    cand = ModuleCandidate(source=text or "", class_name=req.class_name, claims_training=req.claims_training,
                           provenance={"source_file": str(Path(req.source).resolve()) if req.source else None})
    art = save_module_candidate(repo, target, capture, cand)
    return art, cand, target


def validate_module(req: ValidateModuleRequest, ctx: ToolContext) -> ValidateModuleResult:
    repo = Repository(ctx.repo_root)
    art, cand, target = _candidate(req, repo)
    report, rep = validate_stored_module(repo, art, cand, target, time=req.time, seeds=req.seeds, rtol=req.rtol,
                                         atol=req.atol, timeout=req.timeout, memory_limit_mb=req.memory_limit_mb,
                                         progress=ctx.progress)
    return ValidateModuleResult(**report.model_dump(), candidate_id=art.ref, target=target.capture, report=rep.ref)


TOOL = register(
    Tool(
        name="validate_module",
        request=ValidateModuleRequest,
        result=ValidateModuleResult,
        fn=validate_module,
        summary="Validate a module-level ModelNew against its capture in a sandbox.",
    )
)
