"""show_capture_tensors: shape, dtype and statistics of every tensor a capture holds (computed now, stored nowhere)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.stats.runs import TensorStatsRow, capture_tensor_rows
from modulelens.tables import rows_table


class ShowCaptureTensorsRequest(BaseModel):
    ref: str = Field(description="Capture reference: name, name:v3 or name@tag.", json_schema_extra={"cli": "argument"})


class ShowCaptureTensorsResult(BaseModel):
    ref: str = Field(description="name:vN of the capture.")
    tensors: list[TensorStatsRow] = Field(description="Inputs, outputs, weights (and gradients when captured), in "
                                          "that order. std is the population std; kurtosis is the excess kurtosis.")
    notes: list[str] = Field(default_factory=list)


def show_capture_tensors(req: ShowCaptureTensorsRequest, ctx: ToolContext) -> ShowCaptureTensorsResult:
    art, rows, notes = capture_tensor_rows(Repository(ctx.repo_root), req.ref)
    return ShowCaptureTensorsResult(ref=art.ref, tensors=rows, notes=notes)


def _render(r: ShowCaptureTensorsResult):
    return rows_table(f"tensors of {r.ref}", ("tensor", "group", "shape", "dtype", "mean", "std", "min", "max", "zeros"),
                      ((t.key, t.group, "x".join(map(str, t.shape)) or "scalar", t.dtype + ("" if t.stored else " (shape-only)"), t.mean, t.std, t.min,
                        t.max, t.zero_frac) for t in r.tensors))

TOOL = register(
    Tool(
        name="show_capture_tensors",
        request=ShowCaptureTensorsRequest,
        result=ShowCaptureTensorsResult,
        fn=show_capture_tensors,
        summary="Show every tensor a capture holds (inputs, outputs, weights, gradients) with shape, dtype and "
        "statistics (mean, std, rms, kurtosis, zero fraction, min, max, NaN/Inf); read-only, nothing is stored.",
        render=_render,
    )
)
