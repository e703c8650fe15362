"""Hostile candidates against the denial (issue 33, item 1): ATen's compute code stays callable by
address where the dispatcher's registrations are poisoned. A candidate reaching it that way must be
a wrapper, the route named, decided by where the kernel sees its CPU time go; honest candidates
(their own loops, copies and allocation in torch) stay custom."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from conftest import validate_source

import modulelens
from modulelens.kernels import templates
from modulelens.registry import ToolContext
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel
from modulelens.validation.sampling import open_task_sampler

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


def _sampling_offered() -> bool:
    fds = open_task_sampler()
    for fd in fds:
        os.close(fd)
    return bool(fds)


SAMPLED = _sampling_offered()


@pytest.fixture(scope="module")
def gelu_card(tmp_path_factory):
    """(repository, card id) of the gelu card of a captured nn.GELU on [64, 256]."""
    repo = tmp_path_factory.mktemp("gelu-repo")
    with modulelens.capture("", name="act", repo=repo, export=False):
        torch.nn.GELU()(torch.randn(64, 256))
    ops = capture_ops(CaptureOpsRequest(ref="act", repeats=3), ToolContext(repo_root=repo))
    return repo, next(c.card_id for c in ops.cards if c.op == "aten.gelu.default")


@pytest.fixture(scope="module")
def linear_repo(tmp_path_factory):
    """A repository holding ``linear`` (an nn.Linear(64, 32) on [16, 64])."""
    repo = tmp_path_factory.mktemp("linear-repo")
    with modulelens.capture("", name="linear", repo=repo, export=False):
        torch.nn.Linear(64, 32)(torch.randn(16, 64))
    return repo


def _card(card, source: str):
    repo, card_id = card
    req = ValidateKernelRequest(source_text=source, target=card_id, backend="cpp", time=False, seeds=1)
    return validate_kernel(req, ToolContext(repo_root=repo))


@pytest.mark.skipif(not SAMPLED, reason="the kernel offers no perf sampling events here")
def test_gelu_called_by_address_past_the_dispatcher_is_a_wrapper_naming_the_route(gelu_card):
    r = _card(gelu_card, (HERE / "gelu_by_address.cpp").read_text())
    assert r.correct and r.verdict == "wrapper", (r.reason, r.denial)
    assert r.denial is not None and r.denial.outcome == "fails", r.denial
    assert "libtorch_cpu.so" in r.denial.detail and "gelu" in r.denial.detail.lower(), r.denial.detail
    assert "past the denied dispatcher" in r.reason, r.reason


@pytest.mark.skipif(not SAMPLED, reason="the kernel offers no perf sampling events here")
def test_the_honest_gelu_template_stays_custom_with_its_time_watched(gelu_card):
    source = templates.render(templates.synthetic_card("aten.gelu.default", [torch.randn(64, 256)]), "cpp").source
    r = _card(gelu_card, source)
    assert r.correct and r.verdict == "custom", (r.reason, r.denial)
    assert "of its sampled CPU time in torch's compute code" in r.denial.detail, r.denial.detail


@pytest.mark.skipif(not SAMPLED, reason="the kernel offers no perf sampling events here")
@pytest.mark.parametrize("tamper", [False, True], ids=["plain", "switching-the-sampler-off-in-a-thread"])
def test_torchs_bundled_sgemm_called_through_ctypes_is_a_wrapper(linear_repo, tamper):
    source = (HERE / "sgemm_by_address.py").read_text().replace("TAMPER = False", f"TAMPER = {tamper}")
    r = validate_source(linear_repo, source, "linear")
    assert r.correct and r.verdict == "wrapper", (r.reason, r.denial)
    assert r.denial is not None and r.denial.outcome == "fails", r.denial
    assert "libtorch_cpu.so" in r.denial.detail and "sgemm" in r.denial.detail, r.denial.detail


def test_an_honest_python_linear_computing_itself_is_custom(linear_repo):
    honest = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))

    def forward(self, x):
        xs, w, b = x.detach().tolist(), self.weight.detach().tolist(), self.bias.detach().tolist()
        rows = [[b[j] + sum(a * c for a, c in zip(row, w[j])) for j in range(len(w))] for row in xs]
        out = torch.empty(len(rows), len(w), dtype=x.dtype)
        for i, row in enumerate(rows):
            for j, v in enumerate(row):
                out[i, j] = v
        return out
'''
    r = validate_source(linear_repo, honest, "linear")
    assert r.correct and r.verdict == "custom", (r.reason, r.denial)
