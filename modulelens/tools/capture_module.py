"""capture_module: capture one submodule call from an unmodified script or a KernelBench file."""

from __future__ import annotations

import time

from pydantic import Field

from modulelens.capture import KIND, CaptureSummary, ScriptCaptureOptions, capture_script, capture_warnings, summarize
from modulelens.paths import input_script
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import Repository
from modulelens.script_progress import script_lines
from modulelens.team.handover import check_push_target, push

MAX_TENSOR_BYTES = 1 << 40  # a bound on max_tensor_bytes (1 TiB): a larger value is a mistake


class CaptureModuleRequest(ScriptCaptureOptions):
    # the other fields are the capture package's options; no docstring, so none in the JSON schema
    script: str = Field(description="Training script, run as is; or a KernelBench file.",
                        json_schema_extra={"cli": "argument"})
    max_tensor_bytes: int | None = Field(None, ge=0, le=MAX_TENSOR_BYTES,
                                         description="Larger tensors are stored shape-only.")
    push: str | None = Field(None, description="Then push it to wandb://ENTITY/PROJECT.")


class CaptureModuleResult(CaptureSummary, ToolReply):
    captures: list[str] = Field(default_factory=list, description="All refs written (one per capturing rank).")
    script_output_tail: str = Field("", description="Last lines the script printed.")
    seconds: float = Field(0.0, description="Wall time of the whole capture run.")
    pushed: str | None = Field(None, description="Where --push sent the capture (wandb://ENTITY/PROJECT/NAME:ALIAS).")
    script_file: str = Field("", description="The script or KernelBench file that ran (resolved).")


@tool
def capture_module(req: CaptureModuleRequest, ctx: ToolContext) -> CaptureModuleResult:
    """Capture one module call (inputs, outputs, weights, init args) from an unmodified script or
    KernelBench file."""
    repo = Repository(ctx.repo_root)
    if req.push:
        check_push_target(req.push)  # before the run: a bad address or missing login fails fast
    script = input_script(req.script, ctx.project, "script")
    ctx.progress(0, 1, f"running {script.name} until {req.module or 'the model'} is called")
    t0 = time.perf_counter()
    said = script_lines(ctx, 0, 1, f"running {script.name} until {req.module or 'the model'} is called")
    done = capture_script(req.model_copy(update={"script": str(script)}), repo, workdir=ctx.project, on_line=said)
    seconds = time.perf_counter() - t0
    summary = summarize(repo.open(KIND, done.ref))
    summary.notes = summary.notes + done.notes
    ctx.progress(1, 1, f"captured {summary.ref}")
    pushed = push(repo, KIND, done.ref, req.push).pushed[0].address if req.push else None
    return CaptureModuleResult(
        warnings=capture_warnings(summary), next=[call("replay_module", ref=summary.ref), call("capture_ops", ref=summary.ref)],
        **summary.model_dump(), captures=done.refs, script_output_tail=done.output_tail[-4000:],
        seconds=round(seconds, 3), pushed=pushed, script_file=str(script),
    )
