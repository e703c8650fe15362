"""capture_ops: record the aten operators a captured module runs, as ranked operator cards."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from modulelens.capture import ScriptCaptureOptions, capture_script
from modulelens.listing import MAX_ITEMS
from modulelens.ops import OpSetSummary, RecordOptions, record_opset, summarize_opset
from modulelens.paths import input_script
from modulelens.registry import ToolContext, tool
from modulelens.replies import call
from modulelens.repo import Repository
from modulelens.script_progress import script_lines


class CaptureOpsRequest(RecordOptions):
    ref: str = Field(
        description="Capture ref, or a script to capture first.",
        json_schema_extra={"cli": "argument"},
    )
    script_args: list[str] = Field(default_factory=list,
                                   json_schema_extra={"cli": "argument"})
    module: str = Field("", description="With a script: which module.")
    top: int = Field(10, ge=1, le=MAX_ITEMS, description="Items listed per list; all are stored.")


def _capture_first(req: CaptureOpsRequest, ctx: ToolContext) -> str:
    """Capture the module from the script named by ``req.ref`` first; returns the capture's ref."""
    script = input_script(req.ref, ctx.project, "ref")
    options = ScriptCaptureOptions(script=str(script), script_args=req.script_args, module=req.module,
                                   max_tensor_bytes=req.max_tensor_bytes, backward=req.backward)
    said = script_lines(ctx, 0, req.repeats + 4, f"capturing {req.module or 'the model'}: running {script.name}")
    return capture_script(options, Repository(ctx.repo_root), workdir=ctx.project, on_line=said).ref


@tool
def capture_ops(req: CaptureOpsRequest, ctx: ToolContext) -> OpSetSummary:
    """Record a capture's aten operators as cards with samples, ranked by time share."""
    repo = Repository(ctx.repo_root)
    is_script = Path(req.ref).suffix == ".py" or (ctx.project / Path(req.ref).expanduser()).is_file()
    if is_script:
        ctx.progress(0, req.repeats + 4, f"capturing {req.module or 'the model'} from {Path(req.ref).name}: "
                     "running the script")
    ref = _capture_first(req, ctx) if is_script else req.ref
    first = 1 if is_script else 0  # the capture of a script is step 0
    steps = first + req.repeats + 3
    ctx.progress(first, steps, f"recording and timing the operators of {ref} ({req.repeats} repeats)")
    opset = record_opset(repo, ref, req, progress=lambda done, total, message: ctx.progress(first + 1 + done, steps, message))
    ctx.progress(steps, steps, f"recorded {opset.ref}")
    summary = summarize_opset(repo, opset.ref, top=req.top)
    if summary.cards:
        top = summary.cards[0].card_id
        summary.next = [call("generate_kernel", card=top), call("profile", target=top)]
    return summary
