"""Timed calls are checked calls (issue 24, item 6; issue 33, item 3: every timed call counts):
candidates that behave only while unobserved are rejected for the right reason, and their honest
twins are not.

* ``phase_spotter.py``: a module candidate that walks the Python stack for a timing phase and then
  returns its previous output (stale);
* ``fingerprint_cache.py`` / ``fingerprint_cache.cpp``: a module candidate and a C++ card candidate
  that return a cached result keyed on three sampled input values;
* ``one_call_in_k.py``: a module candidate that reads its place in the batch from the harness's
  stack and computes only every 4th call, the batch's last always (below the 10x flag);
* ``cross_batch_cache.py``: an exact cache across batches (always right when it hits), with slow
  honest work: timed on a cache if two batches of one side ever see the same inputs;
* ``helper_thread.py`` / ``helper_process.py``: half the work done by a helper thread, or a forked
  helper process, that moves itself off the CPU the timing pinned the process to (issue 37: not
  timed faster than its honest twin on either clock).

A timed batch is one ``CallRequest`` handled by the same harness function as a check; every batch
gets fresh values and a fresh swap seed (the n-th batches of both sides of a round the same ones)
and swaps between its calls; the harness keeps every call's outputs and, after every timed batch,
random calls drawn by the checker are copied out and checked against the reference."""

from __future__ import annotations

import re
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
        source = (source.replace("STALE = True", "STALE = False").replace("CACHE = True", "CACHE = False")
                  .replace("K = 4", "K = 1").replace("HELP = True", "HELP = False"))
    return validate_source(repo, source, time=True, limit=100)  # every check listed, passed ones too


@pytest.mark.parametrize("name", ["phase_spotter.py", "fingerprint_cache.py"])
def test_a_candidate_that_cheats_only_while_timed_is_rejected(repo, name):
    r = _module(repo, name, honest=False)
    assert r.verdict == "rejected" and not r.correct, r.reason
    assert DISAGREE in r.reason and "timed batch" in r.reason, r.reason
    assert r.speedup_vs_eager is None


@pytest.mark.parametrize("name", ["phase_spotter.py", "fingerprint_cache.py", "one_call_in_k.py"])
def test_the_honest_twin_is_correct_and_its_timed_batches_were_checked(repo, name):
    r = _module(repo, name, honest=True)
    assert r.correct and r.verdict != "rejected", r.reason
    check = next(c for c in r.checks if c.name == "timed outputs match the original")
    assert check.passed and int(check.detail.split()[0]) >= 2, check.detail
    assert r.timing_status in ("ok", "undetermined")
    assert r.speedup_interval is not None or "range of round ratios" in r.timing_reason, r.timing_reason


def test_a_candidate_computing_one_call_in_k_is_rejected_on_a_call_it_skipped(repo):
    r = _module(repo, "one_call_in_k.py", honest=False)
    assert r.verdict == "rejected" and not r.correct, (r.reason, r.timing_note, r.timing_reason)
    # caught on a timed batch, or (batches of one call on a busy machine) on an extra one built like them
    found = re.search(r"call (\d+) of a (?:timed batch|batch like the timed ones) of (\d+) call", r.reason)
    assert DISAGREE in r.reason and found, r.reason
    skipped, calls = int(found.group(1)), int(found.group(2))
    assert (calls - skipped) % 4, f"call {skipped} of {calls} was one it computed: {r.reason}"
    assert r.speedup_vs_eager is None


def test_a_cache_across_batches_is_not_timed_faster_than_its_honest_twin(repo):
    """Its cache never hits, since no two batches share inputs: it is timed on its (slow) work like
    the twin, not on lookups (before, the second batch of each round was all hits and the round
    kept it: several times faster)."""
    cached = _module(repo, "cross_batch_cache.py", honest=False)
    honest = _module(repo, "cross_batch_cache.py", honest=True)
    for r in (cached, honest):
        assert r.correct and r.verdict != "rejected", r.reason
        assert r.candidate is not None, r.timing_reason
    # each report's base and candidate come from one clock (wall, or CPU time under load): compare their ratios
    cached_ratio = cached.eager.median_s / cached.candidate.median_s
    honest_ratio = honest.eager.median_s / honest.candidate.median_s
    assert cached_ratio < 1.6 * honest_ratio, (cached.timing_note, honest.timing_note)


@pytest.mark.parametrize("name", ["helper_thread.py", "helper_process.py"])
def test_a_helper_on_another_cpu_is_not_timed_faster_than_its_honest_twin(repo, name):
    """With a free core the helper halves the wall time of a batch; the batches then used more CPU
    time than wall time allows for one thread, so the wall clock is refused and the CPU time of the
    process tree (which counts the helper: a thread, or a child in the candidate's PID namespace)
    decides: no gain on either clock."""
    helped = _module(repo, name, honest=False)
    honest = _module(repo, name, honest=True)
    for r in (helped, honest):
        assert r.correct and r.verdict != "rejected", r.reason
    if helped.speedup_vs_eager is not None:
        ceiling = honest.speedup_vs_eager or honest.eager.median_s / honest.candidate.median_s
        assert helped.speedup_vs_eager <= 1.25 * ceiling, (helped.timing_note, honest.timing_note)
    parallel = [f for f in helped.measurement.findings if f.kind == "cpus"]
    if parallel:  # the helper ran beside the main thread: the wall clock could not decide
        assert helped.measurement.clock == "cpu" or helped.speedup_vs_eager is None, helped.timing_note


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
