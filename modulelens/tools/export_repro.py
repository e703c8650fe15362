"""export_repro: write a standalone KernelBench-format file for a capture (see
:mod:`modulelens.capture.repro`): ``Model``, ``get_inputs`` and ``get_init_inputs``, with its
captured data, needing only torch and safetensors to run."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from modulelens.capture import KIND, ReproFile, capture_manifest, check_repro, check_seconds_for, write_repro
from modulelens.errors import ModuleLensError, arg
from modulelens.paths import output_folder
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply
from modulelens.repo import Artifact, Repository


class ExportReproRequest(BaseModel):
    ref: str = Field(description="Capture ref.", json_schema_extra={"cli": "argument"})
    out: str = Field("repros", description="Folder to write in.")
    flavor: Literal["auto", "source", "export"] = Field("auto", description="source: inline code; export: program.")
    verify: bool = Field(True, description="Run it to check it.")
    check_seconds: float | None = Field(None, description="Check time limit (s).")
    allow_outside: bool = Field(False, description="Write outside the project and the repository.")


class ExportReproResult(ToolReply):
    ref: str
    path: str = Field(description="The standalone file.")
    data_dir: str
    flavor: str = Field(description="source or export.")
    skipped: list[str] = Field(default_factory=list, description="Why other flavours were not used.")
    verified: bool | None = Field(None, description="The file ran and reproduced the captured outputs (None: not run).")
    max_abs_error: float | None = None
    check_output: str = ""


def _write_into(art: Artifact, out: Path, flavor: str) -> ReproFile:
    """:func:`write_repro` into a hidden folder made inside ``out``, then its file and data folder
    moved into ``out`` (an older export of the same version replaced): a failure at any point leaves
    nothing behind (nor ``out`` when this call made it), and a write error is one line naming the
    cause."""
    made = not out.exists()
    done = False
    staging: Path | None = None
    try:
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".repro.", suffix=".tmp", dir=out))
        staged = write_repro(art, staging, flavor)
        path, data_dir = out / staged.path.name, out / staged.data_dir.name
        if data_dir.is_dir() and not data_dir.is_symlink():
            shutil.rmtree(data_dir)
        os.replace(staged.data_dir, data_dir)
        os.replace(staged.path, path)
        done = True
    except OSError as exc:
        raise ModuleLensError(f"cannot write the repro into {out}: {exc.strerror or exc}",
                              f"give {arg('out')} a folder you can write to") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if made and not done:
            with contextlib.suppress(OSError):
                out.rmdir()  # only when empty
    return dataclasses.replace(staged, path=path, data_dir=data_dir)


def _remove(written: ReproFile, folder_made: bool) -> None:
    """Take back what :func:`_write_into` wrote: the file, its data folder and the output folder
    when that call made it (only if nothing else is in it by now)."""
    with contextlib.suppress(FileNotFoundError):
        written.path.unlink()
    shutil.rmtree(written.data_dir, ignore_errors=True)
    if folder_made:
        with contextlib.suppress(OSError):
            written.path.parent.rmdir()


@tool
def export_repro(req: ExportReproRequest, ctx: ToolContext) -> ExportReproResult:
    """Write a standalone KernelBench-format file (+ data) for a capture and run it once to check it
    reproduces the capture: one that fails is removed (the error says why), one past its time limit
    kept, unchecked."""
    if req.check_seconds is not None and not 0 < req.check_seconds <= 86_400:
        raise ModuleLensError(f"{arg('check_seconds')} must be a number of seconds above 0 (at most a day), "
                              f"not {req.check_seconds:g}", "leave it out for a limit scaled to the captured call")
    out = output_folder(req.out, ctx.project)
    art = Repository(ctx.repo_root).open(KIND, req.ref)
    folder_made = not out.exists()
    written = _write_into(art, out, req.flavor)
    result = ExportReproResult(ref=art.ref, path=str(written.path), data_dir=str(written.data_dir),
                               flavor=written.flavor, skipped=written.skipped)
    if req.verify:
        limit = req.check_seconds or check_seconds_for(capture_manifest(art).forward_seconds)
        try:
            check = check_repro(written.path, timeout=limit)
        except BaseException:
            _remove(written, folder_made)
            raise
        if check.timed_out:
            result.warnings.append(
                f"written, not checked: the check run of {written.path} was stopped at its limit of {limit:g} s; "
                f"the file and {written.data_dir.name}/ are kept: run the file yourself, or export again with "
                f"a larger {arg('check_seconds', 'SECONDS')}")
        elif not check.verified:
            _remove(written, folder_made)
            raise ModuleLensError(f"the repro {written.path} ({written.flavor}) failed its check against {art.ref}: {check.reason}; "
                                  "the file and its data were removed",
                                  f"pass {arg('verify', False)} to write it without the check and run it to see its output")
        else:
            result.verified, result.max_abs_error, result.check_output = check.verified, check.max_abs_error, check.output
    else:
        result.warnings.append("not run: the file was written without checking that it reproduces the capture")
    result.warnings += [f"flavour not used: {s}" for s in written.skipped][:2]
    return result
