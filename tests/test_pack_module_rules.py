"""Module pack entries with shape rules: a ``ModelNew`` declares the dimensions of its inputs it takes
at other sizes (``# modulelens-variable-dims:``), validation checks it there on fresh inputs against
the original module (eval, and training with gradients when it claims training), and the packed
entry serves a live model at sizes that were not captured; a call outside the rule runs eager and is
counted as a miss with its reason. A candidate wrong only at a size that was not captured is
rejected naming that size. Torch-only candidates (no C++ build): a few seconds per validation."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn

from conftest import TanhScale, validate_source

import modulelens
from modulelens.registry import ToolContext

pytestmark = pytest.mark.slow


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 16), TanhScale(16))


@pytest.fixture(scope="module")
def gate_repo(tmp_path_factory):
    """A repository holding ``gate``: the TanhScale at ``1`` captured in training, batch 4 and sequence 6."""
    repo = tmp_path_factory.mktemp("gate-repo")
    torch.manual_seed(0)
    with modulelens.capture("1", name="gate", repo=repo, backward=True, export=False):
        _net().train()(torch.randn(4, 6, 16)).sum().backward()
    return repo


SOURCE = """
import torch
import torch.nn as nn

# modulelens-variable-dims: {rule}


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
{body}
"""


def _validate(repo, rule: str, body: str, claims_training: bool = False):
    source = SOURCE.format(rule=rule, body=textwrap.indent(textwrap.dedent(body), " " * 8))
    return validate_source(repo, source, "gate", claims_training=claims_training)


def test_a_module_entry_with_a_rule_serves_sizes_that_were_not_captured(gate_repo):
    from modulelens.tools.pack import PackRequest, pack

    r = _validate(gate_repo, "0.0 0.1", "return torch.tanh(x) * self.weight", claims_training=True)
    assert r.correct, r.reason
    rule = r.shape_rule
    assert rule.checked and [d.at for d in rule.dims] == [[(0, 0)], [(0, 1)]]
    assert [d.sizes for d in rule.dims] == [[1, 3, 4, 9], [1, 3, 6, 13]]

    packed = pack(PackRequest(candidates=[r.candidate_id], force=True), ToolContext(repo_root=gate_repo))
    torch.manual_seed(1)
    net, eager = _net().train(), _net().train()
    eager.load_state_dict(net.state_dict())
    applied = modulelens.apply_pack(net, packed.path)
    try:
        for shape in ((2, 5, 16), (3, 11, 16), (4, 20, 16)):  # two sizes inside the rule, one outside
            x = torch.randn(*shape)
            got, want = net(x), eager(x)
            assert torch.equal(got, want), shape
            got.pow(2).sum().backward()
            want.pow(2).sum().backward()
            for p, q in zip(net.parameters(), eager.parameters()):
                assert torch.allclose(p.grad, q.grad, atol=1e-6), shape
    finally:
        applied.remove()
    (entry,) = applied.report().entries
    assert entry.hits_by_phase == {"forward": 2} and entry.fallbacks == 1, entry
    (reason,) = entry.fallback_reasons
    assert "dimension 1 is 20, outside the shape rule (checked 1..13)" in reason, entry.fallback_reasons
    assert "admits 1..9" in entry.shape_rule and "admits 1..13" in entry.shape_rule


def test_a_module_candidate_wrong_only_at_another_size_is_rejected_naming_it(gate_repo):
    r = _validate(gate_repo, "0.0 0.1", """
        out = torch.tanh(x) * self.weight
        return out if x.shape[1] == 6 else out * 1.01
        """)
    assert r.verdict == "rejected" and not r.correct
    assert "shape rule: 0.1 at size 1" in r.reason, r.reason
    assert r.shape_rule is None


def test_a_module_rule_that_does_not_fit_the_call_is_rejected(gate_repo):
    r = _validate(gate_repo, "0.3", "return torch.tanh(x) * self.weight")
    assert r.verdict == "rejected" and "does not fit the module's call: argument 0 has 3 dimensions" in r.reason, r.reason


def test_a_training_candidate_whose_gradient_is_wrong_only_at_another_size_is_rejected(gate_repo):
    r = _validate(gate_repo, "0.0 0.1", """
        class Tanh(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                y = torch.tanh(t)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return g * (1 - y * y) * (1.0 if y.shape[0] == 4 else 1.5)

        return Tanh.apply(x) * self.weight
        """, claims_training=True)
    assert r.verdict == "rejected", r.reason
    assert "gradients against the original module, shape rule: 0.0 at size 1: input 0" in r.reason, r.reason
