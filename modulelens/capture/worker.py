"""The capture worker, both sides: ``python -m modulelens.capture.worker REQUEST.json OUT_DIR``.

The user's script runs in this worker, never in the caller's process (see
:mod:`modulelens.workers`), and the process simply ends after the capture. Under ``torchrun``
every rank runs the worker and writes its own result.

Parent side: :func:`capture_script` turns :class:`ScriptCaptureOptions` (the ``capture_module``
request) into a :class:`CaptureWorkerRequest`, and :func:`run_capture_worker` sends it and reads the
:class:`CaptureWorkerResult` of every rank. Child side: :func:`run` (through :func:`main`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from modulelens.capture.budget import DEFAULT_CAPTURE_BYTES
from modulelens.capture.runner import default_name, is_kernelbench_file
from modulelens.errors import CaptureFailed, ModuleLensError
from modulelens.repo import Repository, validate_name
from modulelens.workers import WorkerResult, WorkerRun, launch_worker, worker_main


class ScriptCaptureOptions(BaseModel):
    """What to run and what to capture: the ``capture_module`` tool's request. ``script`` and
    ``script_args`` are positional arguments on the CLI."""

    script: str = Field(
        description="Or: a KernelBench file.",
        json_schema_extra={"cli": "argument"},
    )
    script_args: list[str] = Field(
        default_factory=list,
        json_schema_extra={"cli": "argument"},
    )
    module: str = Field(
        "",
        description="blocks.1.attn, glob blocks.*.mlp or type:Class; empty: whole model.",
    )
    name: str | None = Field(None)
    call: int = Field(1, ge=1, description="Which matching call.")
    kind: Literal["auto", "script", "kernelbench"] = Field("auto")
    backward: bool = Field(False, description="Also capture gradients.")
    export: bool = Field(True, description="Save a torch.export program.")
    pickle: bool = Field(False)
    max_tensor_bytes: int | None = Field(
        None, ge=0, description="Larger tensors are stored shape-only."
    )
    max_capture_bytes: int = Field(
        DEFAULT_CAPTURE_BYTES, gt=0, description="Weights+inputs+outputs budget (above: rows or shapes only)."
    )
    nproc: int = Field(1, ge=1, description="Processes under torchrun.")
    ranks: str = Field("0", description="'0', '0,1' or 'all'.")
    timeout: float = Field(900.0, gt=0, description="Seconds.")


class CaptureWorkerRequest(BaseModel):
    """What the worker runs and captures (the tool has resolved defaults: nothing here has one)."""

    script: str = Field(description="absolute path of the script or KernelBench file")
    script_args: list[str]
    kind: Literal["script", "kernelbench"]
    module: str = Field(description="the target: qualified name, glob, type:Class, or '' for the root")
    name: str = Field(description="capture name (validated); ranks append -rank<R> when several capture")
    call: int
    backward: bool
    export: bool
    pickle: bool
    max_tensor_bytes: int | None
    max_capture_bytes: int
    ranks: str = Field(description="'all' or comma-separated ranks that capture")
    repo: str = Field(description="repository root")
    workdir: str = Field(description="absolute folder the script runs in (its working directory, first on sys.path): "
                         "the call's project folder; recorded as the capture's RunSource.cwd")


class CaptureWorkerResult(WorkerResult):
    """What one rank did: ``ref`` of the capture it wrote (None when it was not asked to record)."""

    rank: int
    world_size: int
    recorded: bool
    ref: str | None = None
    notes: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class ScriptCapture:
    """What :func:`capture_script` wrote: ``refs`` (one per capturing rank, by rank), notes of the
    ranks that captured, and the last lines the run printed."""

    refs: list[str]
    notes: list[str]
    output_tail: str

    @property
    def ref(self) -> str:
        """The capture of the lowest capturing rank."""
        return self.refs[0]


# -- parent side ------------------------------------------------------------------------------

def run_capture_worker(
    request: CaptureWorkerRequest, *, nproc: int, timeout: float, on_line: Callable[[str], None] | None = None,
) -> WorkerRun[CaptureWorkerResult]:
    """Run the capture in a worker process (under torchrun when ``nproc`` > 1) and read what each
    rank wrote (:func:`~modulelens.workers.launch_worker`). Raises the first failure a rank
    reported, :class:`CaptureFailed` when the worker timed out, and
    :class:`~modulelens.workers.WorkerDied` when it ended without writing any result."""
    timeout_error = CaptureFailed(
        f"the script did not reach the capture within {timeout:.0f} s and was stopped",
        "raise [--timeout], or check that the target module is called early in the run",
    )
    return launch_worker("modulelens.capture.worker", request, CaptureWorkerResult, what="capture",
                         timeout=timeout, timeout_error=timeout_error, cwd=request.workdir, nproc=nproc,
                         on_line=on_line)


def capture_script(options: ScriptCaptureOptions, repo: Repository, *, workdir: Path,
                   on_line: Callable[[str], None] | None = None) -> ScriptCapture:
    """Capture from an unmodified script or KernelBench file into ``repo``, in a worker process
    (see :func:`run_capture_worker`) that runs in ``workdir`` (the call's project folder: where the
    user would run the script). Raises :class:`CaptureFailed` when the script does not exist or no
    rank captured. ``on_line`` hears each line the script prints (see :func:`launch_worker`)."""
    script = Path(options.script).expanduser()
    if not script.is_file():
        raise CaptureFailed(f"script {options.script!r} does not exist", "give the path of a Python file")
    kind = options.kind
    if kind == "auto":
        kind = "kernelbench" if is_kernelbench_file(script) else "script"
    request = CaptureWorkerRequest(
        script=str(script.resolve()), script_args=options.script_args, kind=kind, module=options.module,
        name=validate_name(options.name) if options.name else default_name(options.module, script),
        call=options.call, backward=options.backward, export=options.export, pickle=options.pickle,
        max_tensor_bytes=options.max_tensor_bytes, max_capture_bytes=options.max_capture_bytes, ranks=options.ranks,
        repo=str(repo.root), workdir=str(Path(workdir).absolute()),
    )
    try:
        run = run_capture_worker(request, nproc=options.nproc, timeout=options.timeout, on_line=on_line)
    finally:
        repo.remove_stale_tmp()  # a worker killed while it wrote (timeout, cancelled call) left its folder
    written = sorted((r for r in run.results.values() if r.ref), key=lambda r: r.rank)
    if not written:
        raise CaptureFailed(f"no rank captured (ranks {options.ranks!r})", "choose ranks that exist in the run")
    return ScriptCapture(
        refs=[r.ref for r in written if r.ref], notes=[n for r in written for n in r.notes], output_tail=run.output_tail
    )


# -- child side -------------------------------------------------------------------------------

def _ranks(spec: str, world: int) -> set[int]:
    if spec.strip() == "all":
        return set(range(world))
    try:
        return {int(x) for x in spec.split(",") if x.strip()}
    except ValueError as e:
        raise ModuleLensError(f"invalid ranks {spec!r}", "use 'all' or a comma-separated list like '0,1'") from e


def run(request: CaptureWorkerRequest) -> CaptureWorkerResult:
    """Run the script with the tracer installed and store the capture (this rank's, if it records)."""
    from modulelens.capture.artifact import save_capture
    from modulelens.capture.manifest import DistributedInfo, RunSource
    from modulelens.capture.runner import run_and_capture, script_error
    from modulelens.capture.tracer import TraceOptions

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    capturing = _ranks(request.ranks, world)
    record = rank in capturing
    options = TraceOptions(
        target=request.module,
        call_index=request.call,
        backward=request.backward,
        export=request.export and record,
        max_tensor_bytes=request.max_tensor_bytes,
        max_capture_bytes=request.max_capture_bytes,
        record=record,
    )
    script = Path(request.script).resolve()
    tracer, captured, error = run_and_capture(
        script=script, script_args=request.script_args, kind=request.kind, options=options
    )
    result = CaptureWorkerResult(rank=rank, world_size=world, recorded=record)
    if not record:
        return result
    if captured is None:
        raise script_error(error, script) if error is not None else tracer.no_match_error()
    name = request.name
    if world > 1 and len(capturing) > 1:
        name = f"{name}-rank{rank}"
    if error is not None:
        result.notes.append(f"the script ended with {type(error).__name__} after the capture: {error}")
    distributed = (
        DistributedInfo(rank=rank, world_size=world, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        if world > 1 or "RANK" in os.environ
        else None
    )
    art = save_capture(
        Repository(request.repo),
        name,
        captured,
        target=request.module,
        source=RunSource(kind=request.kind, script=str(script), argv=request.script_args, cwd=request.workdir),
        pickle_module=request.pickle,
        extra_sys_path=[str(script.parent), request.workdir],
        distributed=distributed,
    )
    result.ref = art.ref
    return result


def main(argv: list[str]) -> None:
    worker_main(run, argv, "capture", CaptureWorkerRequest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
