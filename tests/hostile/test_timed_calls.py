"""Timed calls are checked calls (issue 24, item 6): candidates that behave only while unobserved
are rejected for the right reason, and their honest twins are not.

* ``phase_spotter.py``: a module candidate that walks the Python stack for a timing phase and then
  returns its previous output (stale);
* ``fingerprint_cache.py`` / ``fingerprint_cache.cpp``: a module candidate and a C++ card candidate
  that return a cached result keyed on three sampled input values.

A timed batch is one ``CallRequest`` handled by the same harness function as a check; the inputs
get fresh values every round and swaps between the calls of a batch; a random sample of timed
batches (at least two) is checked against the reference after it ran."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import capture_tanh_scale, validate_source

import modulelens
from modulelens.registry import ToolContext
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
DISAGREE = "its timed outputs disagree with the reference"


class SoftmaxHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 96)

    def forward(self, x):
        return torch.softmax(self.proj(x), dim=-1)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("timed-calls-repo")
    capture_tanh_scale(repo, dim=64, batch=32)
    with modulelens.capture("", name="head", repo=repo, export=False):
        SoftmaxHead()(torch.randn(64, 32))
    return repo


def _module(repo: Path, name: str, honest: bool):
    source = (HERE / name).read_text()
    if honest:
        source = source.replace("STALE = True", "STALE = False").replace("CACHE = True", "CACHE = False")
    return validate_source(repo, source, time=True)


@pytest.mark.parametrize("name", ["phase_spotter.py", "fingerprint_cache.py"])
def test_a_candidate_that_cheats_only_while_timed_is_rejected(repo, name):
    r = _module(repo, name, honest=False)
    assert r.verdict == "rejected" and not r.correct, r.reason
    assert DISAGREE in r.reason and "timed batch" in r.reason, r.reason
    assert r.speedup_vs_eager is None


@pytest.mark.parametrize("name", ["phase_spotter.py", "fingerprint_cache.py"])
def test_the_honest_twin_is_correct_and_its_timed_batches_were_checked(repo, name):
    r = _module(repo, name, honest=True)
    assert r.correct and r.verdict != "rejected", r.reason
    check = next(c for c in r.checks if c.name == "timed outputs match the original")
    assert check.passed and int(check.detail.split()[0]) >= 2, check.detail
    assert r.timing_status in ("ok", "undetermined")
    assert r.speedup_interval is not None or "range of round ratios" in r.timing_reason, r.timing_reason


def test_a_cpp_kernel_caching_on_sampled_values_is_rejected_and_its_twin_is_not(repo):
    ops = capture_ops(CaptureOpsRequest(ref="head", repeats=3), ToolContext(repo_root=repo))
    card = next(c for c in ops.cards if c.op == "aten._softmax.default").card_id
    source = (HERE / "fingerprint_cache.cpp").read_text()

    def validate(text: str):
        return validate_kernel(ValidateKernelRequest(source_text=text, target=card, backend="cpp", seeds=1, limit=100),
                               ToolContext(repo_root=repo))

    r = validate(source)
    assert r.verdict == "rejected" and DISAGREE in r.reason, r.reason
    twin = validate(source.replace("#define CACHE 1", "#define CACHE 0"))
    assert twin.verdict == "custom" and twin.correct, twin.reason
    assert any(c.name == "timed outputs match the reference" and c.passed for c in twin.checks), [(c.name, c.passed, c.detail) for c in twin.checks if "timed" in c.name or not c.passed]
