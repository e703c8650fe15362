"""optimize on a capture searches the module level beside its top cards: transformers' GPT-2
activation (NewGELUActivation, eight pointwise operators) gets a fused ModelNew from the module
template, with its own backward and a shape rule (every dimension variable); the winners of both levels are packed together and applied: the
module entry serves forward and backward at the captured size and another, and the card entry never fires inside it. About a minute
(a C++ card kernel and a ModelNew built and validated in the sandbox)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modulelens
from modulelens.registry import ToolContext

pytestmark = pytest.mark.slow


def _mlp() -> nn.Module:
    from transformers.activations import NewGELUActivation

    return nn.Sequential(nn.Linear(16, 64), NewGELUActivation(), nn.Linear(64, 16))


@pytest.fixture(scope="module")
def act_capture(tmp_path_factory):
    """A repository holding the capture ``act`` of the MLP's activation (training, with gradients) and its cards."""
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops

    repo = tmp_path_factory.mktemp("act-repo")
    torch.manual_seed(0)
    with modulelens.capture("1", name="act", repo=repo, backward=True, export=False):
        mlp = _mlp().train()
        mlp(torch.randn(4, 8, 16)).sum().backward()
    capture_ops(CaptureOpsRequest(ref="act", repeats=3), ToolContext(repo_root=repo))
    return repo


def test_optimize_a_capture_searches_its_module_and_packs_both_levels(act_capture):
    from modulelens.tools.optimize import OptimizeRequest, optimize
    from modulelens.tools.pack import PackRequest, pack

    ctx = ToolContext(repo_root=act_capture)
    result = optimize(OptimizeRequest(targets=["act"], max_evals=1, top=1), ctx)
    (module,) = result.modules
    assert module.class_path == "transformers.activations:NewGELUActivation" and module.evaluations == 1
    (node,) = module.nodes
    assert node.candidate == "act.module:v1" and node.correct, node
    # "best" only when surely faster: on a busy machine the interval may not tell, and then there is none
    if module.best_candidate is not None:
        assert module.best_candidate == node.candidate and module.speedup_interval, module
    else:
        assert module.speedup_vs_eager is None, module
    card = result.targets[0]
    # only a best that is surely faster than eager is suggested for the pack; a warning names the others
    surely = [c for c, i in ((card.best_candidate, card.speedup_interval),
                             (module.best_candidate, module.speedup_interval)) if c and i and i[0] > 1]
    assert result.pack_candidates == surely, (result.pack_candidates, result.warnings)
    for best in {card.best_candidate, module.best_candidate} - set(surely) - {None}:
        assert any(best in w and "not surely faster" in w for w in result.warnings), result.warnings
    again = optimize(OptimizeRequest(targets=["act"], max_evals=1, top=1), ctx)  # a rerun reuses the stored child
    assert again.modules[0].evaluations == 0 and [n.candidate for n in again.modules[0].nodes] == [node.candidate]

    # both levels packed (--force: whatever this shared machine measured), whichever card candidate was tried
    card_winner = card.best_candidate or next(
        f"{name}:v1" for name in modulelens.repo.Repository(act_capture).names("candidates") if ".card" in name)
    packed = pack(PackRequest(candidates=[card_winner, node.candidate], force=True), ctx)
    torch.manual_seed(1)
    mlp, eager = _mlp().train(), _mlp().train()
    eager.load_state_dict(mlp.state_dict())
    applied = modulelens.apply_pack(mlp, packed.path)
    try:  # the captured size, and another one: the template declares every dimension variable
        for x in (torch.randn(4, 8, 16), torch.randn(3, 5, 16)):
            mlp(x).pow(2).sum().backward()
            eager(x).pow(2).sum().backward()
    finally:
        applied.remove()
    for p, q in zip(mlp.parameters(), eager.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5)
    by_id = {e.candidate_id: e for e in applied.report().entries}
    assert by_id[node.candidate].hits_by_phase == {"forward": 2, "backward": 2}
    assert "admits 1..129" in by_id[node.candidate].shape_rule  # the hidden size 64 checked up to 129
    assert by_id[card_winner].hits == 0  # its operator runs inside the module entry only


def test_a_module_no_template_fits_says_why(tmp_path):
    from modulelens.search.model import SearchSettings
    from modulelens.search.modules import search_module

    with modulelens.capture("", name="lin", repo=tmp_path, export=False):
        nn.Linear(4, 4)(torch.randn(2, 4))
    outcome = search_module(modulelens.repo.Repository(tmp_path), "lin", SearchSettings())
    assert outcome.best_candidate is None and outcome.evaluations == 0
    assert "it has parameters" in outcome.template_note
