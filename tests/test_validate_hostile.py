"""Hostile candidates: each is caught for the right reason, and nothing it does harms the caller."""

from __future__ import annotations

import textwrap

import anyio
import mcp
import pytest
from conftest import full_report
import torch
import torch.nn as nn

import modulelens
from modulelens.registry import ToolContext
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

pytestmark = pytest.mark.slow


class SoftmaxHead(nn.Module):
    def __init__(self, dim: int, classes: int):
        super().__init__()
        self.proj = nn.Linear(dim, classes)

    def forward(self, x):
        return torch.softmax(self.proj(x), dim=-1)


@pytest.fixture(scope="module")
def softmax_card(tmp_path_factory):
    repo = tmp_path_factory.mktemp("hostile-repo")
    with modulelens.capture("", name="head", repo=repo, export=False):
        SoftmaxHead(32, 96)(torch.randn(64, 32))
    ops = capture_ops(CaptureOpsRequest(ref="head", repeats=3), ToolContext(repo_root=repo))
    card = next(c for c in ops.cards if c.op == "aten._softmax.default")
    return repo, card.card_id


def _validate(softmax_card, body: str, backend: str = "triton", **kw):
    repo, card_id = softmax_card
    source = textwrap.dedent(body)
    if backend == "triton":  # Python sources: the candidate module imports torch like any kernel file would
        source = "import torch\n\n" + source
    req = ValidateKernelRequest(source_text=source, target=card_id, backend=backend, **kw)
    return validate_kernel(req, ToolContext(repo_root=repo))


HOSTILE = {
    "returns zeros": ("""
        def forward(x, dim, half_to_float):
            return torch.zeros_like(x)
        """, "output 0 is wrong"),
    "returns its input": ("""
        def forward(x, dim, half_to_float):
            return x
        """, "shares memory with the inputs"),
    "returns stale memory": ("""
        def forward(x, dim, half_to_float):
            return torch.empty_like(x)   # may hold a result computed just before
        """, "output 0 is wrong"),
    "mutates its input": ("""
        def forward(x, dim, half_to_float):
            y = torch.softmax(x, dim)
            x.mul_(2.0)
            return y
        """, "mutates input 0"),
    "computes part of the output": ("""
        def forward(x, dim, half_to_float):
            y = torch.softmax(x, dim)
            y[y.shape[0] // 2:] = 0.0
            return y
        """, "output 0 is wrong"),
    "allocates far beyond the limit": ("""
        def forward(x, dim, half_to_float):
            big = torch.empty(1 << 40, dtype=torch.uint8)
            return big[: x.numel()].view_as(x)
        """, "memory"),
    "prints to stdout": ("""
        def forward(x, dim, half_to_float):
            print("debug: computing softmax")
            return torch.softmax(x, dim)
        """, "wrote"),
    "segfaults": ("""
        import ctypes

        def forward(x, dim, half_to_float):
            ctypes.string_at(0)
        """, "SIGSEGV"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_candidate_is_rejected_for_the_right_reason(softmax_card, name):
    body, expected = HOSTILE[name]
    r = _validate(softmax_card, body)
    assert r.verdict == "rejected" and not r.correct, (name, r.reason)
    assert expected in r.reason, (name, r.reason)


def test_replacing_the_timer_reaches_only_the_candidates_own_process(softmax_card):
    """The checker's clock lives in another process: patching time.perf_counter changes nothing."""
    r = _validate(softmax_card, """
        import time
        time.perf_counter = lambda: 0.0

        def forward(x, dim, half_to_float):
            return torch.softmax(x, dim)
        """)
    assert r.verdict == "wrapper" and r.correct, r.reason
    assert "process separation" in r.isolation.in_force()


def test_sleeping_candidate_times_out(softmax_card):
    r = _validate(softmax_card, """
        import time

        def forward(x, dim, half_to_float):
            time.sleep(3600)
        """, timeout=20)
    assert r.verdict == "rejected" and "timed out after 20 s" in r.reason and r.stage == "check"


def test_calling_torch_softmax_is_a_wrapper(softmax_card):
    r = _validate(softmax_card, """
        def forward(x, dim, half_to_float):
            return torch.softmax(x, dim)
        """)
    assert r.verdict == "wrapper" and r.correct, r.reason
    assert any("softmax" in c for c in r.backend_calls)


def test_cpp_wrapper_calls_are_seen_through_the_dispatcher(softmax_card):
    r = _validate(softmax_card, """
        #include <torch/extension.h>
        torch::Tensor forward(torch::Tensor x, int64_t dim, bool half_to_float) {
            return at::_softmax(x, dim, half_to_float);
        }
        """, backend="cpp")
    assert r.verdict == "wrapper" and r.correct, r.reason


def test_compile_error_is_short_and_usable(softmax_card):
    r = _validate(softmax_card, """
        #include <torch/extension.h>
        torch::Tensor forward(torch::Tensor x, int64_t dim, bool half_to_float) {
            return undefined_function(x);
        }
        """, backend="cpp")
    assert r.verdict == "rejected" and r.stage == "compile"
    assert "undefined_function" in r.errors[0] and len(r.errors[0]) < 1000


def test_mcp_session_survives_a_segfaulting_candidate(softmax_card):
    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    repo, card_id = softmax_card
    server = build_server(all_tools(), repo_root=repo)
    crash = "import ctypes\n\ndef forward(x, dim, half_to_float):\n    ctypes.string_at(0)\n"

    async def session():
        async with mcp.Client(server) as c:
            r = await c.call_tool("validate_kernel", {"source_text": crash, "target": card_id, "backend": "triton"})
            assert not r.is_error and r.structured_content["verdict"] == "rejected"
            assert "SIGSEGV" in r.structured_content["reason"]
            r = await c.call_tool("list", {"kind": "cards", "of": card_id.split("/")[0]})
            assert not r.is_error and r.structured_content["cards"]
            r = await c.call_tool("validate_kernel", {"source_text": "import torch\n\ndef forward(x, dim, h):\n"
                                                      "    return torch.softmax(x, dim)\n",
                                                      "target": card_id, "backend": "triton"})
            assert not r.is_error and r.structured_content["verdict"] == "wrapper"

    anyio.run(session)


GENUINE_TRITON = """
import triton
import triton.language as tl


@triton.jit
def _softmax_rows(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * cols + offs, e / tl.sum(e, axis=0), mask=mask)


def forward(x, dim, half_to_float):
    x = x.contiguous()
    y = torch.empty_like(x)
    cols = x.shape[-1]
    _softmax_rows[(x.numel() // cols,)](x, y, cols, BLOCK=triton.next_power_of_2(cols))
    return y
"""


def test_a_genuine_triton_kernel_is_custom_though_its_interpreter_uses_numpy(softmax_card):
    r = _validate(softmax_card, GENUINE_TRITON, time=False)
    assert r.verdict == "custom" and r.correct, (r.reason, r.backend_calls)
    assert "/proc/PID/maps" in full_report(r).wrapper_evidence


@pytest.mark.parametrize("body, library", [
    ("""
        import numpy as np

        def forward(x, dim, half_to_float):
            a = x.numpy()
            e = np.exp(a - a.max(axis=dim, keepdims=True))
            return torch.from_numpy(e / e.sum(axis=dim, keepdims=True))
        """, "numpy"),
    ("""
        def forward(x, dim, half_to_float):
            import scipy.special
            return torch.as_tensor(scipy.special.softmax(x.numpy(), axis=dim))
        """, "scipy"),
])
def test_a_candidate_computing_with_a_foreign_library_is_a_wrapper_naming_it(softmax_card, body, library):
    r = _validate(softmax_card, body, time=False)
    assert r.verdict == "wrapper" and r.correct, r.reason
    assert library in r.reason, r.reason
