"""Long work over MCP: progress heartbeats during silent phases, cancellation that stops worker
processes, start-then-poll jobs, sampling on every protocol version, and captures whose caller
died (not published, temporary folders removed on the next write)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import mcp
import pytest
from mcp import types
from conftest import wait_until
from pydantic import BaseModel

from modulelens.cancellation import CallCancelled
from modulelens.mcp_server import calls
from modulelens.mcp_server.server import build_server
from modulelens.registry import Tool, ToolContext
from modulelens.repo import Repository
from modulelens.repo.owners import owner_of, this_process
from modulelens.tools import all_tools, get_tool

ROOT = Path(__file__).resolve().parent.parent

WAITING_SCRIPT = """
import os, subprocess, sys, time
from pathlib import Path
import torch
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a child of the script
Path({ready!r}).write_text("ready")
while not Path({go!r}).exists():
    time.sleep(0.05)
torch.nn.Sequential(torch.nn.Linear(4, 4))(torch.randn(2, 4))
"""


def _marked(marker: str) -> list[int]:
    """Pids of the processes whose environment holds ``marker``."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def marker(monkeypatch):
    """A unique environment marker inherited by every worker process this test starts."""
    value = f"modulelens-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("MODULELENS_TEST_MARKER", value)
    yield value
    for pid in _marked(value):  # never leave a process behind, even when the test fails
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _waiting_script(tmp_path: Path) -> tuple[Path, Path, Path]:
    ready, go = tmp_path / "ready", tmp_path / "go"
    script = tmp_path / "waits.py"
    script.write_text(WAITING_SCRIPT.format(ready=str(ready), go=str(go)))
    return script, ready, go


# -- progress --------------------------------------------------------------------------------

class SlowRequest(BaseModel):
    seconds: float = 1.5


class SlowResult(BaseModel):
    slept: float


def _slow_build(req: SlowRequest, ctx: ToolContext) -> SlowResult:
    """A phase that reports once and then nothing while it works (like a compiler)."""
    ctx.progress(0, 2, "compiling")
    time.sleep(req.seconds)
    ctx.progress(2, 2, "done")
    return SlowResult(slept=req.seconds)


SLOW = Tool("slow_build", SlowRequest, SlowResult, _slow_build, "A slow silent build.")


def test_a_silent_phase_still_sends_progress(monkeypatch):
    monkeypatch.setattr(calls, "HEARTBEAT_S", 0.2)
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def main():
        async with mcp.Client(build_server([SLOW])) as c:
            r = await c.call_tool("slow_build", {"seconds": 1.5}, progress_callback=on_progress)
            assert not r.is_error, r.content

    anyio.run(main)
    beats = [s for s in seen if s[2] and s[2].startswith("compiling (")]
    assert len(beats) >= 3, seen
    values = [s[0] for s in seen]
    assert values == sorted(values) and len(set(values)) == len(values), values  # strictly increasing
    assert seen[-1][2] == "done"


# -- cancellation ----------------------------------------------------------------------------

def test_cancelling_capture_module_stops_its_worker(tmp_path, marker):
    script, ready, _ = _waiting_script(tmp_path)
    repo = tmp_path / "repo"

    async def main():
        async with mcp.Client(build_server(all_tools(), repo_root=repo)) as c:
            async with anyio.create_task_group() as tg:
                async def call():
                    await c.call_tool("capture_module", {"script": str(script), "module": "0", "name": "never"})

                tg.start_soon(call)
                await anyio.to_thread.run_sync(wait_until, ready.exists, 120, "the script to start")
                assert len(_marked(marker)) >= 2  # the worker and the script's own child
                tg.cancel_scope.cancel()

    anyio.run(main)
    wait_until(lambda: not _marked(marker), 15, "the worker processes to end")
    assert Repository(repo).names("captures") == []
    assert not list((repo / ".tmp").glob("*"))  # nothing half-written left behind


class CancelledSandbox:
    """A sandbox whose call is cancelled while the candidate compiles."""

    def run(self, task, timeout, memory_limit_mb=None, on_stage=None):
        on_stage("compile")
        raise CallCancelled("the sandbox worker (during compile)")


def test_a_cancelled_validation_leaves_an_interrupted_report(softmax_card):
    """A validation cancelled in the sandbox still gets a report, saying it was interrupted."""
    from modulelens.kernels import load_candidate
    from modulelens.validation.stored_reports import latest_report
    from modulelens.validation.report import ValidationSettings
    from modulelens.validation.sandboxed import validate_candidate

    repo, card = softmax_card
    gen = get_tool("generate_kernel")
    cand = gen(gen.request(card=card, backend="cpp", provider="template"), ToolContext(repo_root=repo))

    store = Repository(repo)
    art, src = load_candidate(store, cand.candidate_id)
    with pytest.raises(CallCancelled):
        validate_candidate(store, art, src, ValidationSettings(card_id=card), timeout=60,
                           sandbox=CancelledSandbox())
    report = latest_report(store, art)
    assert report is not None and "interrupted" in report.flags and report.stage == "compile"
    assert report.reason.startswith("interrupted")


MODEL_NEW = """
import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
"""


def test_a_cancelled_module_validation_leaves_an_interrupted_report(tmp_path, monkeypatch):
    import torch

    import modulelens
    from modulelens.validation import sandboxed
    from modulelens.validation.stored_reports import latest_report

    with modulelens.capture("", name="sm", repo=tmp_path, export=False):
        torch.nn.Softmax(dim=-1)(torch.randn(4, 6))
    monkeypatch.setattr(sandboxed, "pool", lambda: CancelledSandbox())
    tool = get_tool("validate_kernel")
    with pytest.raises(CallCancelled):
        tool(tool.request(source_text=MODEL_NEW, target="sm"), ToolContext(repo_root=tmp_path))
    store = Repository(tmp_path)
    (name,) = store.names("candidates")
    report = latest_report(store, store.open("candidates", name))
    assert report is not None and "interrupted" in report.flags and report.stage == "compile"
    assert report.backend == "module" and report.reason.startswith("interrupted")


@pytest.fixture
def sandbox_marker(monkeypatch):
    """A unique marker in an environment variable the sandbox lets through to its workers."""
    value = f"modulelens-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("TORCH_MODULELENS_TEST_MARKER", value)
    yield value
    for pid in _marked(value):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_cancelling_optimize_stops_its_sandbox_workers(tmp_path, sandbox_marker):
    import torch

    import modulelens
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops

    repo = tmp_path / "repo"
    with modulelens.capture("", name="sm", repo=repo, export=False):
        torch.nn.Softmax(dim=-1)(torch.randn(8, 12))
    ops = capture_ops(CaptureOpsRequest(ref="sm", repeats=3), ToolContext(repo_root=repo))
    card = next(c.card_id for c in ops.cards if "softmax" in c.op)

    async def main():
        async with mcp.Client(build_server(all_tools(), repo_root=repo)) as c:
            async with anyio.create_task_group() as tg:
                async def call():
                    await c.call_tool("optimize", {"targets": [card], "max_evals": 24, "workers": 2})

                tg.start_soon(call)
                await anyio.to_thread.run_sync(wait_until, lambda: len(_marked(sandbox_marker)) >= 2, 120,
                                               "the search's sandbox workers to start")
                await anyio.sleep(1.0)
                tg.cancel_scope.cancel()

    started = time.monotonic()
    anyio.run(main)
    wait_until(lambda: not _marked(sandbox_marker), 15, "the sandbox workers to end")
    assert time.monotonic() - started < 25  # stopped at once, not after the call's 30 s grace


# -- jobs ------------------------------------------------------------------------------------

def test_start_job_then_poll_and_cancel(tmp_path, marker):
    script, ready, go = _waiting_script(tmp_path)
    repo = tmp_path / "repo"

    async def main():
        async with mcp.Client(build_server(all_tools(), repo_root=repo)) as c:
            started = await c.call_tool("start_job", {"tool": "capture_module",
                                                      "arguments": {"script": str(script), "module": "0"}})
            assert not started.is_error, started.content
            job = started.structured_content["job"]
            assert started.structured_content["state"] == "running"
            await anyio.to_thread.run_sync(wait_until, ready.exists, 120, "the job's script to start")
            go.write_text("go")
            done = await c.call_tool("job_status", {"job": job, "wait": 50})
            assert done.structured_content["state"] == "done", done.structured_content
            assert done.structured_content["result"]["ref"] == "0:v1"

            ready.unlink()
            go.unlink()
            second = await c.call_tool("start_job", {"tool": "capture_module",
                                                     "arguments": {"script": str(script), "module": "0"}})
            job2 = second.structured_content["job"]
            await anyio.to_thread.run_sync(wait_until, ready.exists, 120, "the second job's script to start")
            cancelled = await c.call_tool("job_status", {"job": job2, "cancel": True})
            assert cancelled.structured_content["state"] == "cancelled", cancelled.structured_content
            unknown = await c.call_tool("job_status", {"job": "nope"})
            assert unknown.is_error and "no job 'nope'" in unknown.content[0].text
            wrong = await c.call_tool("start_job", {"tool": "list", "arguments": {"kind": "captures"}})
            assert wrong.is_error and "capture_module" in wrong.content[0].text

    anyio.run(main)
    wait_until(lambda: not _marked(marker), 15, "the job's worker processes to end")
    assert Repository(repo).versions("captures", "0") == [1]


def test_validate_kernel_through_start_job_then_poll(softmax_card):
    """The long-running path a client with a short request timeout takes: start_job, then
    job_status until the job is done; the verdict comes back and the report is stored."""
    from modulelens.kernels import load_candidate
    from modulelens.validation.stored_reports import REPORTS, latest_report, report_name

    repo, card = softmax_card
    gen = get_tool("generate_kernel")
    cand = gen(gen.request(card=card, backend="cpp", provider="template"), ToolContext(repo_root=repo))

    async def main():
        async with mcp.Client(build_server(all_tools(), repo_root=repo)) as c:
            started = await c.call_tool("start_job", {"tool": "validate_kernel",
                                                      "arguments": {"candidate": cand.candidate_id, "seeds": 1}})
            assert not started.is_error, started.content
            job = started.structured_content["job"]
            deadline = time.monotonic() + 480
            while True:
                status = await c.call_tool("job_status", {"job": job, "wait": 20})
                assert not status.is_error, status.content
                if status.structured_content["state"] != "running" or time.monotonic() > deadline:
                    return status.structured_content

    status = anyio.run(main)
    assert status["state"] == "done", status
    result = status["result"]
    assert result["candidate_id"] == cand.candidate_id and result["verdict"] == "custom", result
    store = Repository(repo)
    art, _ = load_candidate(store, cand.candidate_id)
    report = latest_report(store, art)
    assert report is not None and report.verdict == "custom" and "interrupted" not in report.flags
    assert result["report"] == f"{report_name(art)}:v{store.versions(REPORTS, report_name(art))[-1]}"


# -- sampling --------------------------------------------------------------------------------

KERNEL = """#include <torch/extension.h>
torch::Tensor forward(torch::Tensor x, int64_t dim, bool half_to_float) {
    return torch::empty_like(x);
}
"""


@pytest.mark.parametrize("mode", ["default", "legacy"])
def test_sampling_on_every_protocol_version(softmax_card, mode):
    """The default protocol (2026-07-28) samples through InputRequiredResult; legacy mid-call."""
    repo, card = softmax_card
    asked: list[types.CreateMessageRequestParams] = []

    async def sampling_callback(context, params: types.CreateMessageRequestParams):
        asked.append(params)
        return types.CreateMessageResult(role="assistant", model="client-model", stop_reason="endTurn",
                                         content=types.TextContent(type="text", text=f"```cpp\n{KERNEL}```"))

    async def main():
        kwargs = {} if mode == "default" else {"mode": "legacy"}
        async with mcp.Client(build_server(all_tools(), repo_root=repo), sampling_callback=sampling_callback,
                              **kwargs) as c:
            r = await c.call_tool("generate_kernel", {"card": card, "backend": "cpp", "provider": "sampling"})
            assert not r.is_error, r.content
            return r.structured_content

    out = anyio.run(main)
    assert out["provider"] == "sampling" and out["provenance"]["model"] == "client-model"
    assert len(asked) == 1 and "aten._softmax.default" in asked[0].messages[0].content.text
    with open(out["source_path"]) as f:
        assert f.read().strip() == KERNEL.strip()


# -- killed callers and stale temporary folders ----------------------------------------------

def test_a_capture_whose_caller_was_killed_is_not_published(tmp_path, marker):
    script, ready, go = _waiting_script(tmp_path)
    repo = tmp_path / "repo"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    caller = subprocess.Popen([sys.executable, "-m", "modulelens", "capture-module", str(script), "--module", "0",
                               "--name", "orphan", "--repo", str(repo)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(ready.exists, 120, "the script to start")
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    go.write_text("go")  # the script would now reach the module and capture
    wait_until(lambda: not _marked(marker), 15, "the orphaned worker to end")
    assert not (repo / "captures" / "orphan").exists() or Repository(repo).versions("captures", "orphan") == []


def test_temporary_folders_of_dead_writers_are_removed(tmp_path):
    tmp_root = tmp_path / "repo" / ".tmp"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner = owner_of(dead.pid)
    dead.wait()
    stale = tmp_root / f"{dead_owner}~captures-x-abc"
    live = tmp_root / f"{this_process()}~captures-y-def"
    for folder in (stale, live):
        folder.mkdir(parents=True)
        (folder / "big.safetensors").write_bytes(b"0" * 1024)
    assert Repository(tmp_path / "repo").remove_stale_tmp() == [stale.name]
    assert live.exists() and not stale.exists()

    stale.mkdir()
    Repository(tmp_path / "repo").create("captures", "z", lambda folder: {})  # the next write cleans up
    assert not stale.exists() and live.exists()
