"""Planted faults of examples/faults/zoo.py give the right finding on the right module, with advice
that follows the evidence; healthy models (MLP, CNN with BatchNorm, LSTM, transformer, raw-scale
inputs into BatchNorm1d) and the healthy look-alikes of each fault (a sparse ReLU router with live
gradients, an embedding frozen by design, attention at its normal scale, a learning rate without a
spike) give none. Run in-process through the Python API."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import EXAMPLES

from modulelens.stats import findings as F
from modulelens.stats.collector import StatsCollector
from modulelens.stats.schema import RunSeries, StatsFinding
from modulelens.stats.series import build_series

sys.path.insert(0, str(EXAMPLES / "faults"))
import zoo  # noqa: E402


def _run(case: str, healthy: bool = False, steps: int = 12, every: int = 1) -> tuple[RunSeries, list[StatsFinding]]:
    torch.manual_seed(0)
    model, batches = zoo.build(case, healthy)
    collector = StatsCollector(model, every=every, plots=False)
    collector.start()
    try:
        zoo.train(model, batches, steps, zoo.learning_rate(case, healthy))
    finally:
        run = collector.finish()
    series = build_series(run)
    return series, F.evaluate(series)


def _findings(case: str, healthy: bool = False, steps: int = 12, every: int = 1) -> list[StatsFinding]:
    return _run(case, healthy, steps, every)[1]


@pytest.mark.parametrize(("case", "healthy"), [
    ("mlp", False), ("cnn-bn", False), ("lstm", False), ("transformer", False), ("raw-bn", False),
    ("branch", True), ("sigmoid20", True), ("router", True), ("frozen-embedding", False), ("attention", True),
])
def test_healthy_models_give_no_findings(case, healthy):
    assert _findings(case, healthy) == []


@pytest.mark.parametrize("steps", [11, 12])
def test_a_branch_that_ran_on_earlier_steps_is_judged_there(steps):
    found = _findings("branch", steps=steps)  # step 11 does not take the branch
    assert [(f.kind, f.module) for f in found] == [("exploding_activation", "branch")]
    f = found[0]
    assert (f.first_step, f.last_step, f.steps_held, f.step) == (0, 10, 5, 10)
    assert f.evidence["gain"] > 300
    # One module, from the first step: its initialisation, not the training.
    assert "initialisation" in f.action and "learning rate" not in f.action
    assert any("first sampled step" in b for b in f.based_on)


def test_vanished_gradients_are_not_called_exploding_near_the_loss():
    found = _findings("sigmoid20")
    assert [f.kind for f in found] == ["vanishing_gradient"]
    f = found[0]
    assert f.module.startswith("layers.") and int(f.module.split(".")[1]) < 39  # upstream, not the head
    assert "clip" not in f.action and f.steps_held == 12


def test_a_sparse_router_with_live_gradients_is_not_dead_and_a_dead_one_is():
    series, found = _run("router", healthy=True)
    zero = series.modules["act"].activation["zero_frac"]
    assert min(zero) > 0.9 and found == []  # as sparse as a dead layer, but every unit gets gradient
    series, found = _run("router")  # router bias -15: no unit ever fires
    assert [(f.kind, f.module) for f in found] == [("dead_activation", "act")]
    f = found[0]
    assert f.evidence["weights"] == "gate" and f.evidence["dead_rows"] >= 0.9
    assert any("zero gradient" in b for b in f.based_on)


def test_an_embedding_frozen_by_design_has_no_dead_rows():
    series, found = _run("frozen-embedding")
    assert found == [] and "emb.weight" not in series.params  # not in the optimizer: not measured
    assert all(v is not None for v in series.params["mlp.0.weight"].dead_rows)


def test_attention_driven_to_one_hot_is_found_over_steps():
    series, found = _run("attention", steps=16)
    assert [(f.kind, f.module) for f in found] == [("softmax_saturation", "attn")]
    f = found[0]
    entropy = series.modules["attn"].softmax["entropy"]
    assert entropy[0] > 0.9 and entropy[-1] < 0.1  # it collapsed during training
    assert series.modules["attn"].softmax_source == ["scaled_dot_product_attention"]
    assert f.first_step > 0 and f.evidence["max_prob"] >= 0.9 and f.evidence["entropy_first"] > 0.9
    assert "q.k" in f.action and f.based_on


def test_a_learning_rate_spike_gets_learning_rate_advice():
    found = _findings("lr-spike", steps=16, every=5)
    assert found and {f.kind for f in found} <= {"exploding_activation", "exploding_gradient"}
    f = found[0]
    assert f.first_step == 15  # the first sampled step after the spike at step 10
    assert "learning rate" in f.action and "clip" in f.action and "initialisation" not in f.action
    assert any("update/weight ratio" in b and "step 10" in b for b in f.based_on)
    assert any("modules rose" in b for b in f.based_on)
    assert _findings("lr-spike", healthy=True, steps=16, every=5) == []
