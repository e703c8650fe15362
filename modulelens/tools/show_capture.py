"""show_capture: what a capture holds and how it can be replayed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from modulelens.capture.values import leaves
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Artifact, Repository


class TensorInfo(BaseModel):
    key: str
    shape: list[int]
    dtype: str
    stored: bool = Field(description="False when stored shape-only (statistics kept, data not).")


class CaptureSummary(BaseModel):
    ref: str = Field(description="name:vN of this capture.")
    name: str
    version: int
    aliases: list[str] = Field(default_factory=list)
    module_path: str = Field(description="Qualified name of the module in the model ('' is the root).")
    class_path: str = Field(description="module:QualName of the module's class.")
    strategies: list[str] = Field(description="Replay strategies this capture supports, in auto order.")
    call_index: int
    training: bool
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    weights: int = Field(description="Number of parameter and buffer tensors.")
    shape_only: list[str] = Field(default_factory=list)
    backward: bool = Field(False, description="Whether gradients were captured.")
    unrecorded: list[str] = Field(default_factory=list, description="Values that could not be recorded.")
    notes: list[str] = Field(default_factory=list)
    rank: int | None = None
    world_size: int | None = None
    created_at: str = ""
    path: str = Field("", description="Folder of this version in the repository.")


def _tensor_infos(spec: Any) -> list[TensorInfo]:
    return [TensorInfo(key=s["key"], shape=s["shape"], dtype=s["dtype"], stored=s.get("stored", True)) for s in leaves(spec)]


def summarize(art: Artifact, aliases: list[str] | None = None) -> CaptureSummary:
    m = art.manifest
    dist = m.get("distributed") or {}
    return CaptureSummary(
        ref=art.ref, name=art.name, version=art.version, aliases=aliases or [],
        module_path=m["module_path"], class_path=m["class_path"], strategies=m["strategies"],
        call_index=m["call_index"], training=m["training"],
        inputs=_tensor_infos(m["inputs"]), outputs=_tensor_infos(m["outputs"]), weights=len(m["weights"]),
        shape_only=m.get("shape_only", []), backward=m.get("backward") is not None,
        unrecorded=m.get("unrecorded", []), notes=m.get("notes", []),
        rank=dist.get("rank"), world_size=dist.get("world_size"), created_at=m.get("created_at", ""),
        path=str(art.path),
    )


class ShowCaptureRequest(BaseModel):
    ref: str = Field(description="Capture reference: name, name:v3 or name@tag.", json_schema_extra={"cli": "argument"})


class ShowCaptureResult(CaptureSummary):
    manifest: dict[str, Any] = Field(description="The full manifest (init arguments, specs, checksums).")


def show_capture(req: ShowCaptureRequest, ctx: ToolContext) -> ShowCaptureResult:
    repo = Repository(ctx.repo_root)
    art = repo.open("captures", req.ref)
    aliases = sorted(k for k, v in repo.aliases("captures", art.name).items() if v == art.version)
    return ShowCaptureResult(**summarize(art, aliases).model_dump(), manifest=art.manifest)


def render_summary(s: CaptureSummary, title: str | None = None):
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(title or s.ref), show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    t.add_row("ref", s.ref + (f"  ({', '.join(s.aliases)})" if s.aliases else ""))
    t.add_row("module", escape(f"{s.module_path or '<root>'}  ({s.class_path})  call {s.call_index}"))
    t.add_row("mode", "train" if s.training else "eval")
    t.add_row("strategies", ", ".join(s.strategies) or "none")
    fmt = lambda xs: ", ".join(f"{x.key} {x.dtype}{x.shape}" + ("" if x.stored else " (shape-only)") for x in xs)  # noqa: E731
    t.add_row("inputs", escape(fmt(s.inputs) or "none"))
    t.add_row("outputs", escape(fmt(s.outputs) or "none"))
    t.add_row("weights", f"{s.weights} tensors")
    if s.backward:
        t.add_row("backward", "gradients captured")
    if s.rank is not None:
        t.add_row("rank", f"{s.rank} of {s.world_size}")
    for u in s.unrecorded:
        t.add_row("[yellow]unrecorded[/]", escape(u))
    for n in s.notes:
        t.add_row("[yellow]note[/]", escape(n))
    t.add_row("path", escape(s.path))
    return t


TOOL = register(
    Tool(
        name="show_capture",
        request=ShowCaptureRequest,
        result=ShowCaptureResult,
        fn=show_capture,
        summary="Show one capture: module, class, inputs/outputs, replay strategies, notes and its manifest.",
        render=lambda r: render_summary(r),
    )
)
