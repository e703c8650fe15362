"""capture_module: capture one submodule call from an unmodified script or a KernelBench file."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from modulelens.capture.runner import default_name, is_kernelbench_file
from modulelens.capture.values import SHAPE_ONLY_DEFAULT_BYTES
from modulelens.errors import CaptureFailed, ModuleLensError
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository, validate_name
from modulelens.tools.show_capture import CaptureSummary, summarize


class CaptureModuleRequest(BaseModel):
    script: str = Field(
        description="Path of the training/inference script to run unmodified, or of a KernelBench-style file "
        "(Model, get_inputs, get_init_inputs).",
        json_schema_extra={"cli": "argument"},
    )
    script_args: list[str] = Field(
        default_factory=list,
        description="Arguments for the script (on the CLI, after --).",
        json_schema_extra={"cli": "argument"},
    )
    module: str = Field(
        "",
        description="Target: a qualified name (blocks.1.attn), a glob (blocks.*.mlp) or type:ClassName. "
        "Empty means the whole model (KernelBench files).",
    )
    name: str | None = Field(None, description="Capture name in the repository (default: from the target).")
    call: int = Field(1, ge=1, description="Which matching call to capture: 1 is the first.")
    kind: Literal["auto", "script", "kernelbench"] = Field(
        "auto", description="How to run the file; auto detects KernelBench-style files."
    )
    backward: bool = Field(False, description="Also capture gradients: the one arriving at the outputs, "
                           "and the input and parameter gradients.")
    export: bool = Field(True, description="Save a torch.export program (replay without source code).")
    pickle: bool = Field(False, description="Also save a pickled module (replay needs --trust-pickle).")
    max_tensor_bytes: int = Field(
        SHAPE_ONLY_DEFAULT_BYTES, description="Tensors larger than this are stored shape-only with statistics."
    )
    nproc: int = Field(1, ge=1, description="Run the script under torchrun with this many processes (gloo/CPU or your backend).")
    ranks: str = Field("0", description="Which ranks capture in a distributed run: '0', '0,1' or 'all'.")
    timeout: float = Field(900.0, gt=0, description="Seconds before the run is stopped.")


class CaptureModuleResult(CaptureSummary):
    captures: list[str] = Field(default_factory=list, description="All refs written (one per capturing rank).")
    script_output_tail: str = Field("", description="Last lines the script printed.")
    seconds: float = Field(0.0, description="Wall time of the whole capture run.")


def _worker_command(req: CaptureModuleRequest, request_file: Path, out_dir: Path) -> list[str]:
    worker = [str(request_file), str(out_dir)]
    if req.nproc > 1:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={req.nproc}", "-m", "modulelens.capture.worker", *worker,
        ]
    return [sys.executable, "-m", "modulelens.capture.worker", *worker]


def _run_worker(cmd: list[str], ctx: ToolContext, timeout: float) -> tuple[int, str]:
    """Run the worker, relaying its output to our stderr (never to stdout: with MCP over stdio,
    stdout is the protocol). Returns the exit code and the last lines of output."""
    tail: collections.deque[str] = collections.deque(maxlen=40)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        text=True, errors="replace",
    )

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if not ctx.stdout_is_protocol:
                sys.stderr.write(line)
                sys.stderr.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        t.join(5)
        raise CaptureFailed(
            f"the script did not reach the capture within {timeout:.0f} s and was stopped",
            "raise --timeout, or check that the target module is called early in the run",
        ) from None
    t.join(5)
    return code, "\n".join(tail)


def capture_module(req: CaptureModuleRequest, ctx: ToolContext) -> CaptureModuleResult:
    script = Path(req.script).expanduser()
    if not script.is_file():
        raise CaptureFailed(f"script {req.script!r} does not exist", "give the path of a Python file")
    kind = req.kind
    if kind == "auto":
        kind = "kernelbench" if is_kernelbench_file(script) else "script"
    name = validate_name(req.name) if req.name else default_name(req.module, script)
    repo = Repository(ctx.repo_root)
    request = {
        "script": str(script.resolve()), "script_args": req.script_args, "module": req.module,
        "name": name, "call": req.call, "kind": kind, "backward": req.backward, "export": req.export,
        "pickle": req.pickle, "max_tensor_bytes": req.max_tensor_bytes, "ranks": req.ranks,
        "repo": str(repo.root),
    }
    ctx.progress(0, 1, f"running {script.name} until {req.module or 'the model'} is called")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="modulelens-capture-") as tmp:
        req_file = Path(tmp) / "request.json"
        req_file.write_text(json.dumps(request))
        code, tail = _run_worker(_worker_command(req, req_file, Path(tmp)), ctx, req.timeout)
        results = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("result-rank*.json"))]
    seconds = time.perf_counter() - t0
    if not results:
        raise CaptureFailed(
            f"the capture worker ended (exit code {code}) without a result",
            "the script may have crashed the interpreter (segfault, out of memory); last output:\n" + tail[-1500:],
        )
    failed = [r for r in results if not r["ok"]]
    if failed:
        f = failed[0]
        raise ModuleLensError(f["error"], f.get("hint"))
    written = sorted((r for r in results if r.get("ref")), key=lambda r: r["rank"])
    if not written:
        raise CaptureFailed(f"no rank captured (ranks {req.ranks!r})", "choose ranks that exist in the run")
    art = repo.open("captures", written[0]["ref"])
    summary = summarize(art)
    summary.notes = summary.notes + [n for r in written for n in r.get("notes", [])]
    ctx.progress(1, 1, f"captured {summary.ref}")
    return CaptureModuleResult(
        **summary.model_dump(), captures=[r["ref"] for r in written], script_output_tail=tail[-4000:],
        seconds=round(seconds, 3),
    )


def _render(r: CaptureModuleResult):
    from modulelens.tools.show_capture import render_summary

    return render_summary(r, title=f"captured {r.ref}")


TOOL = register(
    Tool(
        name="capture_module",
        request=CaptureModuleRequest,
        result=CaptureModuleResult,
        fn=capture_module,
        summary="Capture one submodule call (inputs, outputs, weights, constructor arguments, RNG state) "
        "from an unmodified script or a KernelBench-style file into the repository; the run ends right "
        "after the capture.",
        render=_render,
    )
)
