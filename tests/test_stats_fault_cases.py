"""Planted faults of examples/faults/zoo.py give the right finding on the right module; healthy models
(MLP, CNN with BatchNorm, LSTM, transformer, raw-scale inputs into BatchNorm1d) and the healthy
twins give none. Run in-process through the Python API, every step sampled."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import EXAMPLES

from modulelens.stats import findings as F
from modulelens.stats.collector import StatsCollector
from modulelens.stats.series import build_series

sys.path.insert(0, str(EXAMPLES / "faults"))
import zoo  # noqa: E402


def _findings(case: str, healthy: bool = False, steps: int = 12) -> list[dict]:
    torch.manual_seed(0)
    model, batches = zoo.build(case, healthy)
    collector = StatsCollector(model, every=1, plots=False)
    collector.start()
    try:
        zoo.train(model, batches, steps)
    finally:
        run = collector.finish()
    return F.evaluate(build_series(run))


@pytest.mark.parametrize(("case", "healthy"), [
    ("mlp", False), ("cnn-bn", False), ("lstm", False), ("transformer", False), ("raw-bn", False),
    ("branch", True), ("sigmoid20", True),
])
def test_healthy_models_give_no_findings(case, healthy):
    assert _findings(case, healthy) == []


@pytest.mark.parametrize("steps", [11, 12])
def test_a_branch_that_ran_on_earlier_steps_is_judged_there(steps):
    found = _findings("branch", steps=steps)  # step 11 does not take the branch
    assert [(f["kind"], f["module"]) for f in found] == [("exploding_activation", "branch")]
    f = found[0]
    assert (f["first_step"], f["last_step"], f["steps_held"], f["step"]) == (0, 10, 5, 10)
    assert f["evidence"]["gain"] > 300


def test_vanished_gradients_are_not_called_exploding_near_the_loss():
    found = _findings("sigmoid20")
    assert [f["kind"] for f in found] == ["vanishing_gradient"]
    f = found[0]
    assert f["module"].startswith("layers.") and int(f["module"].split(".")[1]) < 39  # upstream, not the head
    assert "clip" not in f["action"] and f["steps_held"] == 12
