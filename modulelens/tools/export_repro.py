"""export_repro: write a standalone KernelBench-format file for a capture (see
:mod:`modulelens.capture.repro`): ``Model``, ``get_inputs`` and ``get_init_inputs``, with its
captured data, needing only torch and safetensors to run."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from modulelens.capture.manifest import KIND
from modulelens.capture.repro import check_repro, write_repro
from modulelens.errors import ModuleLensError
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply
from modulelens.repo import Repository


class ExportReproRequest(BaseModel):
    ref: str = Field(description="Capture ref.", json_schema_extra={"cli": "argument"})
    out: str = Field("repros", description="Folder to write into.")
    flavor: Literal["auto", "source", "export"] = Field("auto", description="source: inline code; export: the program.")
    verify: bool = Field(True, description="Run the file once to check it.")


class ExportReproResult(ToolReply):
    ref: str
    path: str = Field(description="The standalone file.")
    data_dir: str
    flavor: str = Field(description="source or export.")
    skipped: list[str] = Field(default_factory=list, description="Why other flavours were not used.")
    verified: bool | None = Field(None, description="The file ran and reproduced the captured outputs (None: not run).")
    max_abs_error: float | None = None
    check_output: str = ""


@tool
def export_repro(req: ExportReproRequest, ctx: ToolContext) -> ExportReproResult:
    """Write a standalone KernelBench-format file (+ data) for a capture."""
    art = Repository(ctx.repo_root).open(KIND, req.ref)
    written = write_repro(art, Path(req.out).expanduser().resolve(), req.flavor)
    result = ExportReproResult(ref=art.ref, path=str(written.path), data_dir=str(written.data_dir),
                               flavor=written.flavor, skipped=written.skipped)
    if req.verify:
        check = check_repro(written.path)
        if not check.verified:
            raise ModuleLensError(f"the repro {written.path} ({written.flavor}) does not reproduce {art.ref}: {check.reason}",
                                  "run the file to see its output; pass [--no-verify] to write it without the check")
        result.verified, result.max_abs_error, result.check_output = check.verified, check.max_abs_error, check.output
    else:
        result.warnings.append("not run: the file was written without checking that it reproduces the capture")
    result.warnings += [f"flavour not used: {s}" for s in written.skipped][:2]
    return result
