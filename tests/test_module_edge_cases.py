"""Module validation feeds the captured module's own edge cases (fully masked rows and padded
positions of its attention mask, NaN and infinities in its other inputs, parameters at zero and
negated scales): a ModelNew that breaks on a fully masked attention row is rejected naming the row,
its honest twin passes, and the report lists every case with where it came from."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import validate_source

import modulelens
from modulelens.validation.module_edge_cases import input_edge_cases, parameter_edge_cases

pytestmark = pytest.mark.slow


class MaskedAttention(nn.Module):
    """One attention head over ``x`` with a query projection and an additive mask, as torch computes
    it (``scaled_dot_product_attention`` gives 0 for a fully masked row)."""

    def __init__(self, dim: int):
        super().__init__()
        self.query = nn.Linear(dim, dim)

    def forward(self, x, mask):
        return F.scaled_dot_product_attention(self.query(x), x, x, attn_mask=mask)


@pytest.fixture(scope="module")
def attention_repo(tmp_path_factory):
    """A repository holding ``attn``: one :class:`MaskedAttention` call on [2, 6, 8] with a causal
    mask (no row of it is fully masked)."""
    repo = tmp_path_factory.mktemp("attn-repo")
    mask = torch.full((6, 6), float("-inf")).triu(1)
    with modulelens.capture("", name="attn", repo=repo, export=False):
        MaskedAttention(8)(torch.randn(2, 6, 8), mask)
    return repo


CANDIDATE = """
import math
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.query = nn.Linear(dim, dim)

    def forward(self, x, mask):
        scores = self.query(x) @ x.transpose(-1, -2) / math.sqrt(x.shape[-1]) + mask
        p = torch.softmax(scores, -1)
{handling}
        return p @ x
"""


def _candidate(handling: str = "") -> str:
    return CANDIDATE.format(handling=textwrap.indent(textwrap.dedent(handling), " " * 8))


def test_a_module_candidate_returning_nan_on_a_fully_masked_attention_row_is_rejected_naming_it(attention_repo):
    reply = validate_source(attention_repo, _candidate(), target="attn")
    assert reply.verdict == "rejected" and not reply.correct, reply.reason
    assert reply.ran, "its calls ran and were compared"
    assert "edge case: row 0 and row 1 of input 1 (an additive attention mask) are all -inf" in reply.reason, reply.reason
    assert "NaN" in reply.reason and "\n" not in reply.reason, reply.reason
    # the captured inputs and fresh draws passed: only the edge case exposed it
    assert any(c.passed and "captured inputs" in c.name for c in reply.checks), reply.checks
    assert reply.failed_edge_case.startswith("row 0 and row 1 of input 1"), reply.failed_edge_case
    # the source is to be fixed for that case and validated again
    assert [(n.tool, n.arguments["target"].split(":")[0]) for n in reply.next] == [("validate_kernel", "attn")], reply.next
    assert not any("compiled only" in w for w in reply.warnings), reply.warnings


def test_its_honest_twin_that_zeroes_fully_masked_rows_passes_every_module_edge_case(attention_repo):
    reply = validate_source(attention_repo, _candidate("""
        p = torch.where(torch.isneginf(scores).all(-1, keepdim=True), torch.zeros_like(p), p)
        """), target="attn")
    assert reply.correct, reply.reason
    (cut,) = [x for x in reply.left_out if x.field == "edge_cases"]
    stored = json.loads(Path(cut.full).read_text())
    listed = " | ".join(stored["edge_cases"])
    for source in ("module: fully masked rows", "module: padded positions", "structural: NaN and infinities",
                   "structural: -0 and denormals", "module: zero parameters"):
        assert source in listed, listed
    checked = " | ".join(c["name"] for c in stored["checks"])
    assert "edge case: the last 1 of 6 positions" in checked and "edge case: every floating parameter is 0" in checked


def test_a_module_candidate_that_breaks_on_zero_parameters_is_rejected_naming_them(scale_repo):
    # rescaled by its largest weight "for stability": right for every random draw, 0/0 when all are 0
    reply = validate_source(scale_repo, textwrap.dedent("""
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(dim))

            def forward(self, x):
                top = self.weight.abs().max()
                return torch.tanh(x) * (self.weight / top) * top
        """))
    assert reply.verdict == "rejected", reply.reason
    assert "edge case: every floating parameter is 0 (weight), captured inputs" in reply.reason, reply.reason
    assert reply.failed_edge_case == "every floating parameter is 0 (weight)"
    (cut,) = [x for x in reply.left_out if x.field == "edge_cases"]
    listed = " | ".join(json.loads(Path(cut.full).read_text())["edge_cases"])
    assert "scales negated (weight times -1), on the captured inputs (module: negative scales)" in listed, listed


def test_module_edge_cases_take_the_captured_mask_pattern_and_keep_shapes():
    x = torch.randn(2, 4, 8)
    padding = torch.zeros(2, 1, 4, 4)
    padding[1, :, :, 3:] = torch.finfo(torch.float32).min  # a right-padded second sequence, as transformers masks
    cases = input_edge_cases([x], {"attention_mask": padding})
    masked = [c for c in cases if c.source == "module: fully masked rows"]
    assert len(masked) == 1 and "row (1, 0, 0) and row (1, 0, 1) of input 1" in masked[0].label, masked[0].label
    m = masked[0].kwargs["attention_mask"]
    assert bool((m[1, 0, :2] == torch.finfo(torch.float32).min).all()) and bool((m[0] == 0).all())
    assert all(c.args[0].shape == x.shape and c.kwargs["attention_mask"].shape == padding.shape for c in cases)
    assert not any("input 1 has NaN" in c.label for c in cases)  # the mask gets mask cases, not random NaN
    bools = input_edge_cases([x, torch.ones(4, 4, dtype=torch.bool)], {})
    assert {("all False" in c.label, "all True" in c.label) for c in bools if "fully masked" in c.source} == {
        (True, False), (False, True)}


def test_parameter_edge_cases_set_tied_parameters_under_every_name():
    lin = nn.Linear(4, 4)
    tied = nn.ModuleDict({"a": lin, "b": lin})
    (zeros,) = [c for c in parameter_edge_cases(tied, tied.state_dict()) if c.source == "module: zero parameters"]
    assert not zeros.state["a.weight"].any() and not zeros.state["b.weight"].any()


def test_the_cli_points_to_the_stored_report_for_the_edge_cases_a_reply_counts(attention_repo, tmp_path, cli):
    source = tmp_path / "honest_attention.py"
    source.write_text(_candidate("""
        p = torch.where(torch.isneginf(scores).all(-1, keepdim=True), torch.zeros_like(p), p)
        """))
    code, _, r = cli("validate-kernel", "--source", source, "--target", "attn", "--seeds", "1", "--no-time",
                     "--allow-outside", "--repo", attention_repo)
    assert code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "more edge_cases not shown (the stored file lists them: " in text, text
    assert "edge_cases not shown (--limit" not in text and "wrapper_evidence not shown (--limit" not in text, text
