"""Shape rules: the declaration a candidate writes, the sizes validation checks it at, and
candidates whose declaration is false or malformed (rejected, saying why)."""

from __future__ import annotations

import pytest
import torch

from modulelens.errors import ModuleLensError
from modulelens.kernels.shape_rules import declared_rule, parse_rule, probe_sizes
from modulelens.registry import ToolContext
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel


def test_a_declaration_is_read_from_a_comment_line_of_either_language():
    rule = declared_rule("#include <x>\n// modulelens-variable-dims: 0.0=1.0 0.1\nint f();\n")
    assert [d.at for d in rule.dims] == [[(0, 0), (1, 0)], [(0, 1)]] and rule.text() == "0.0=1.0 0.1"
    assert declared_rule("import torch\n    # modulelens-variable-dims: 2.3\n").dims[0].at == [(2, 3)]
    assert declared_rule("x = 'modulelens-variable-dims: 0.0'\n") is None  # only a comment declares


@pytest.mark.parametrize("text, why", [("0.x", "malformed variable dimension '0.x'"), ("0.0 0.0", "appears twice"),
                                       ("", "names no dimension")])
def test_a_malformed_declaration_says_what_is_wrong(text, why):
    with pytest.raises(ModuleLensError, match=why):
        parse_rule(text)


def test_probe_sizes_are_not_captured_and_cover_one_smaller_and_larger():
    assert probe_sizes(16) == [1, 9, 33]
    assert probe_sizes(2) == [1, 5] and probe_sizes(1) == [3]


# A softmax over the last dimension that is right only at the captured shape, declaring that any
# number of rows works.
LIAR = """
import torch
# modulelens-variable-dims: 0.0
def forward(x, dim, half_to_float):
    out = torch.softmax(x, dim)
    return out if x.shape[0] == 16 else out * 0
"""


@pytest.mark.parametrize("source, reason", [
    (LIAR, "is wrong on shape rule: 0.0 at size 1"),
    ("# modulelens-variable-dims: 1.0\ndef forward(x, dim, half_to_float):\n    return x\n",
     "its declared shape rule (1.0) does not fit the card: argument 1 is not a tensor"),
    ("# modulelens-variable-dims: 0.two\ndef forward(x, dim, half_to_float):\n    return x\n",
     "malformed variable dimension '0.two'"),
])
def test_a_false_or_malformed_rule_is_rejected_for_its_reason(softmax_card, source, reason):
    repo, card = softmax_card
    r = validate_kernel(ValidateKernelRequest(source_text=source, target=card, backend="triton", time=False,
                                              seeds=1), ToolContext(repo_root=repo))
    assert r.verdict == "rejected" and reason in r.reason, r.reason
    assert r.shape_rule is None



class _SequenceMean(torch.nn.Module):
    def forward(self, x):
        return x.mean(dim=1, keepdim=True)


def _validated_template(repo, make, x: torch.Tensor, op: str):
    """The validation report of the triton template (interpreted) for the ``op`` card of
    ``make()(x)`` (the module built inside the capture, so its construction is recorded)."""
    import modulelens
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
    from modulelens.tools.generate_kernel import GenerateKernelRequest, generate_kernel

    ctx = ToolContext(repo_root=repo)
    with modulelens.capture("", name="m", repo=repo, export=False):
        make()(x)
    (card,) = [c.card_id for c in capture_ops(CaptureOpsRequest(ref="m", repeats=3), ctx).cards if c.op == op]
    cand = generate_kernel(GenerateKernelRequest(card=card, backend="triton"), ctx).candidate_id
    return validate_kernel(ValidateKernelRequest(candidate=cand, time=False, seeds=1), ctx)


@pytest.mark.slow
def test_a_reduction_template_is_validated_at_its_rule_sizes(tmp_path):
    """The triton template (interpreted) of the reduction family declares its rule (the dimension
    before the reduced one) and passes validation at sizes not captured. (The rms_norm template's
    operator decomposes on CPU, so no card of it is captured here: its rule is exercised by
    tests/test_kernels_templates.py.)"""
    r = _validated_template(tmp_path, _SequenceMean, torch.randn(4, 6, 16), "aten.mean.dim")
    assert r.correct, r.reason
    assert r.shape_rule.checked and [d.sizes for d in r.shape_rule.dims] == [[1, 3, 4, 9]], r.shape_rule


@pytest.mark.slow
def test_a_pooling_template_is_validated_at_its_rule_sizes(tmp_path):
    """The pooling template's batch and channels vary (its planes are read at run time): checked at
    sizes not captured, each on its own; the spatial sizes stay as captured."""
    r = _validated_template(tmp_path, lambda: torch.nn.AdaptiveAvgPool2d((3, 5)), torch.randn(2, 3, 10, 7), "aten._adaptive_avg_pool2d.default")
    assert r.correct, r.reason
    assert r.shape_rule.checked and r.shape_rule.text() == "0.0 0.1", r.shape_rule
    assert [d.sizes for d in r.shape_rule.dims] == [[1, 2, 5], [1, 3, 7]], r.shape_rule
