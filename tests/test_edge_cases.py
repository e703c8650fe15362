"""Every card verdict checks the operator's own edge cases (masked rows, constant rows, exp overflow,
NaN and infinities, -0 and denormals, OpInfo samples): the most common honest mistakes (a softmax
with no care for fully masked rows, a layer norm without eps, a log-softmax without the max
subtracted, a ReLU that maps NaN to 0) are rejected naming the case, and correct kernels pass."""

from __future__ import annotations

import json
from pathlib import Path

import textwrap

import pytest
import torch
import torch.nn as nn

import modulelens
from modulelens.registry import ToolContext
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel
from modulelens.validation.edge_cases import capped_for_interpreter, edge_cases

pytestmark = pytest.mark.slow


class EdgeBlock(nn.Module):
    """Attention-like scores with a causal mask, and the operators whose edge cases are tested."""

    def forward(self, x, mask):
        safe = torch.ops.aten._safe_softmax.default(x + mask, -1)
        logp = torch.log_softmax(x, -1)
        normed = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-12)  # as BERT: eps matters only at variance 0
        return safe, logp, normed, torch.relu(x)


@pytest.fixture(scope="module")
def edge_cards(tmp_path_factory):
    """(repository, {op: card id}) of one captured :class:`EdgeBlock` call on [8, 8]."""
    repo = tmp_path_factory.mktemp("edge-repo")
    mask = torch.full((8, 8), float("-inf")).triu(1)  # causal: no row is fully masked
    with modulelens.capture("", name="edge", repo=repo, export=False):
        EdgeBlock()(torch.randn(8, 8), mask)
    ops = capture_ops(CaptureOpsRequest(ref="edge", repeats=3), ToolContext(repo_root=repo))
    return repo, {c.op: c.card_id for c in ops.cards}


def _validate(edge_cards, op: str, body: str):
    repo, cards = edge_cards
    source = "import torch\n\n" + textwrap.dedent(body)
    req = ValidateKernelRequest(source_text=source, target=cards[op], backend="triton", seeds=1, time=False)
    return validate_kernel(req, ToolContext(repo_root=repo))


def test_a_softmax_returning_nan_on_fully_masked_rows_is_rejected_for_safe_softmax(edge_cards):
    reply = _validate(edge_cards, "aten._safe_softmax.default", """
        def forward(x, dim, dtype=None):
            e = torch.exp(x - x.amax(dim, keepdim=True))
            return e / e.sum(dim, keepdim=True)
        """)
    assert reply.verdict == "rejected" and not reply.correct
    assert "all -inf" in reply.reason and "row " in reply.reason, reply.reason
    assert "expected 0, got NaN" in reply.reason, reply.reason
    assert reply.failed_edge_case and "all -inf" in reply.failed_edge_case, reply.failed_edge_case
    # fix the source for that case and validate again: a template draw (generate_kernel) is no fix
    assert [n.tool for n in reply.next] == ["validate_kernel"], reply.next
    # its outputs were compared: not "compiled only"
    assert reply.ran and not any("compiled only" in w for w in reply.warnings), (reply.ran, reply.warnings)


def test_a_safe_softmax_that_zeroes_masked_rows_passes_every_edge_case(edge_cards):
    reply = _validate(edge_cards, "aten._safe_softmax.default", """
        def forward(x, dim, dtype=None):
            e = torch.exp(x - x.amax(dim, keepdim=True))
            y = e / e.sum(dim, keepdim=True)
            return torch.where(torch.isneginf(x).all(dim, keepdim=True), torch.zeros_like(y), y)
        """)
    assert reply.correct, reply.reason
    # the reply counts them in left_out; the stored report it points to lists every one
    (cut,) = [x for x in reply.left_out if x.field == "edge_cases"]
    stored = json.loads(Path(cut.full).read_text())
    assert cut.total == len(stored["edge_cases"]) > 0
    listed = " | ".join(stored["edge_cases"])
    assert "structural: fully masked rows" in listed and "OpInfo softmax" in listed, listed


def test_a_layer_norm_without_eps_is_rejected_on_constant_rows(edge_cards):
    reply = _validate(edge_cards, "aten.native_layer_norm.default", """
        def forward(x, normalized_shape, weight, bias, eps):
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
            rstd = 1.0 / torch.sqrt(var)
            return (x - mean) * rstd, mean, rstd
        """)
    assert reply.verdict == "rejected", reply.reason
    assert "constant" in reply.reason and "NaN" in reply.reason, reply.reason


def test_a_log_softmax_without_the_max_subtracted_is_rejected_on_overflow(edge_cards):
    reply = _validate(edge_cards, "aten._log_softmax.default", """
        def forward(x, dim, half_to_float):
            return x - torch.log(torch.exp(x).sum(dim, keepdim=True))
        """)
    assert reply.verdict == "rejected", reply.reason
    assert "exp overflow" in reply.reason and "shifted by +" in reply.reason, reply.reason


def test_a_relu_mapping_nan_to_zero_is_rejected(edge_cards):
    reply = _validate(edge_cards, "aten.relu.default", """
        def forward(x):
            return torch.where(x > 0, x, torch.zeros_like(x))
        """)
    assert reply.verdict == "rejected", reply.reason
    assert "NaN of the reference missing" in reply.reason and "expected NaN, got 0" in reply.reason, reply.reason


def test_structural_cases_stay_in_the_captured_shape_and_take_the_captured_mask():
    x = torch.randn(4, 6)
    x[2, 3:] = float("-inf")  # partly masked, as a padded attention row
    cases = edge_cases("aten._safe_softmax.default", [x, -1], {})
    masked = next(c for c in cases if c.source == "structural: fully masked rows")
    assert masked.label.startswith("row 2 of input 0 is all -inf"), masked.label
    assert bool(torch.isneginf(masked.args[0][2]).all()) and bool(torch.isfinite(masked.args[0][0]).all())
    assert all(c.args[0].shape == x.shape and c.args[0].stride() == x.stride() for c in cases)
    assert all(c.args[1] == -1 for c in cases)


def test_under_the_triton_interpreter_a_few_edge_cases_run_the_family_case_and_nan_first():
    x = torch.randn(4, 6)
    cases = edge_cases("aten._safe_softmax.default", [x, -1], {})
    kept, note = capped_for_interpreter(cases, limit=3)
    # the family's first case, NaN and infinities, then the next in order (the exp cases come later)
    assert [c.source for c in kept] == ["structural: fully masked rows", "structural: masked column",
                                        "structural: NaN and infinities"]
    assert note.startswith(f"{len(cases) - 3} of {len(cases)} edge cases not run: at most 3 under the Triton "
                           "interpreter"), note
    assert all(c.label in note for c in cases if c not in kept)
    assert capped_for_interpreter(cases[:2], limit=3) == (cases[:2], "")


def test_opinfo_values_are_not_cached_empty_where_op_db_cannot_be_imported(tmp_path):
    """A validation on a machine without expecttest must not leave the operator without OpInfo
    samples for good: once expecttest is installed, the next validation finds them."""
    import os
    import subprocess
    import sys

    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "expecttest.py").write_text("raise ImportError('expecttest is not installed here')\n")
    env = {**os.environ, "MODULELENS_BUILD_DIR": str(tmp_path / "build"), "OMP_NUM_THREADS": "1"}
    fill = [sys.executable, "-m", "modulelens.validation.edge_cases", "relu"]
    subprocess.run(fill, env={**env, "PYTHONPATH": str(blocker)}, check=True, timeout=300)
    assert not list((tmp_path / "build" / "opinfo").glob("relu-*.pt"))
    subprocess.run(fill, env=env, check=True, timeout=300)
    (cached,) = (tmp_path / "build" / "opinfo").glob("relu-*.pt")
    assert any(torch.load(cached, weights_only=True).values())
