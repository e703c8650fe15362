"""Held-out training scripts of gather_stats round 4 (tests/stats_round4_cases.py), run in-process
through the Python API: trainable weights that never get a gradient (a detached encoder), an RNN
whose gradient explodes on the first sampled step, a gate whose scale is a buffer at zero, healthy
zero-initialised learnable scales (ReZero), and a learning-rate spike in one layer. Each finding is
checked at its module and step, for the cause it states, and each ``based_on`` line against the
series it cites."""

from __future__ import annotations

import sys

import torch
from conftest import EXAMPLES

import stats_round4_cases as C
from modulelens.stats import findings as F
from modulelens.stats.collector import StatsCollector
from modulelens.stats.schema import RunSeries, StatsFinding
from modulelens.stats.series import build_series
from test_stats_findings import series_of


def _run(model: torch.nn.Module, train, every: int = 1) -> tuple[RunSeries, list[StatsFinding]]:
    collector = StatsCollector(model, every=every, plots=False)
    collector.start()
    try:
        train()
    finally:
        run = collector.finish()
    series = build_series(run)
    return series, F.evaluate(series)


def kinds(found: list[StatsFinding]) -> list[tuple[str, str]]:
    return [(f.kind, f.module) for f in found]


# -- a detached encoder ----------------------------------------------------------------------


def test_a_detached_encoder_is_found_where_the_graph_is_cut():
    torch.manual_seed(0)
    model = C.DetachedEncoder()
    series, found = _run(model, lambda: C.train_dense(model, 6, torch.optim.Adam(model.parameters(), 1e-3)))
    assert kinds(found) == [("no_gradient", "encoder")]
    [f] = found
    params = ["encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"]
    assert (f.first_step, f.steps_held, f.evidence["parameters"], f.evidence["grad"]) == (0, 6, params, "None")
    assert "not a layer frozen by design" in f.message and ".detach()" in f.action
    # Each based_on line against the series.
    assert f.based_on[0].startswith("4 parameter(s) of encoder") and "None on all 6 sampled steps" in f.based_on[0]
    assert all(v is None for p in params for v in series.params[p].grad_norm)
    assert f.based_on[1] == f"their update/weight ratio was at most {max(max(series.params[p].update_ratio) for p in params):.3g} on those steps"
    assert all(v == 0.0 for p in params for v in series.params[p].update_ratio)
    assert "output of encoder is None on every sampled step" in f.based_on[2]
    assert series.modules["encoder"].gradient == {}  # no gradient ever reached its output


def test_an_encoder_frozen_on_purpose_is_not_a_finding():
    torch.manual_seed(0)
    model = C.DetachedEncoder()
    model.encoder.requires_grad_(False)  # frozen, yet still handed to the optimizer
    series, found = _run(model, lambda: C.train_dense(model, 4, torch.optim.Adam(model.parameters(), 1e-3)))
    assert found == [] and not series.params["encoder.0.weight"].requires_grad
    assert series.params["head.weight"].requires_grad


# -- an exploding ReLU RNN -------------------------------------------------------------------


def _rnn(gain: float, every: int) -> tuple[RunSeries, list[StatsFinding]]:
    torch.manual_seed(0)
    model = C.ReluRNN(16, gain)  # recurrent weight orthogonal x gain; plain SGD, no clipping
    return _run(model, lambda: C.train_rnn(model, 30, lr=0.05, length=40), every=every)


def test_an_exploding_relu_rnn_is_found_on_its_first_sampled_step():
    for every in (1, 5):
        series, found = _rnn(1.3, every)
        assert kinds(found) == [("exploding_parameter_gradient", "rnn")], every
        [f] = found
        assert (f.step, f.first_step) == (0, 0) and f.evidence["parameter"] == "rnn.weight_hh_l0"
        assert f.evidence["recurrent"] is True and "clip" in f.action and "spectral radius" in f.action
        hh = series.params["rnn.weight_hh_l0"]
        others = sorted(v for v in hh.grad_to_weight[1:] if v)
        median = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
        line = (f"rnn.weight_hh_l0: gradient/weight ratio {hh.grad_to_weight[0]:.3g} at step 0, "
                f"{hh.grad_to_weight[0] / median:.3g}x its median {median:.3g} over the other {len(others)} sampled steps")
        assert line in f.based_on
        assert hh.grad_to_weight[0] >= 10 and hh.update_ratio[0] >= 0.1  # the absolute bounds, on the first step
        # The module-output gradient does not show it: the explosion is summed inside the RNN.
        out = series.modules["rnn"].gradient["rms"][0]
        assert any(f"output of rnn has rms {out:.3g} at step 0" in b for b in f.based_on)
        assert out < series.modules["head"].gradient["rms"][0]


def test_a_contracting_relu_rnn_is_clean():
    assert _rnn(0.9, 5)[1] == []


def test_adams_large_first_step_is_not_an_update_spike():
    # Adam's first update is lr x sign(grad): at lr 3e-2 it moves small weights by 0.4 of their norm,
    # more than ten times further than its later steps, by design.
    sys.path.insert(0, str(EXAMPLES / "faults"))
    import zoo

    torch.manual_seed(0)
    model, batches = zoo.build("mlp")
    series, found = _run(model, lambda: zoo.train(model, batches, 30, 3e-2))
    ratio = series.params["2.weight"].update_ratio
    later = sorted(ratio[1:])
    assert ratio[0] >= 0.1 and ratio[0] >= 10 * later[len(later) // 2]  # what a rule over the whole history flags
    assert found == []


# -- a gate whose scale is a buffer at zero --------------------------------------------------


def test_a_buffer_gate_at_zero_is_a_zero_multiplier_not_a_dead_activation():
    torch.manual_seed(0)
    model = C.buffer_gate()
    series, found = _run(model, lambda: C.train_dense(model, 6, torch.optim.Adam(model.parameters(), 1e-3)))
    assert kinds(found) == [("zero_scale", "blocks.0.gate")]
    [f] = found
    assert "not a dead activation" in f.message and "buffer" in f.message
    assert "negative" not in f.message and "LeakyReLU" not in f.action and "nn.Parameter" in f.action
    top = series.modules["blocks.0.gate"].activation["input_max"][-1]
    rms = series.modules["blocks.0.gate"].activation["input_rms"][-1]
    assert top == series.modules["blocks.0.act"].activation["max"][-1] > 0  # its input is the ReLU's output
    assert f"its input has rms {rms:.3g} and max {top:.3g}: positive values that an activation would pass" in f.based_on
    assert series.modules["blocks.0.gate"].activation["zero_frac"] == [1.0] * 6
    assert not [p for p in series.params if p.startswith("blocks.0.gate")]  # no parameter: a buffer
    assert f.evidence["weights"] == "blocks.0.fc" and series.params["blocks.0.fc.weight"].dead_rows[-1] == 1.0


# -- zero-initialised learnable scales -------------------------------------------------------


def test_a_healthy_rezero_is_clean():
    for lr in (1e-3, 1e-2):
        torch.manual_seed(0)
        model = C.rezero()
        series, found = _run(model, lambda model=model, lr=lr: C.train_dense(model, 12, torch.optim.Adam(model.parameters(), lr)))
        assert found == [], (lr, kinds(found))
        alpha = series.params["blocks.0.gate.alpha"].weight_norm
        assert alpha[0] == 0.0 and alpha[1] > 0  # zero at step 0, learning from step 1
        assert series.modules["blocks.0.gate"].activation["zero_frac"][0] == 1.0


def test_a_scale_that_stays_at_zero_is_found():
    torch.manual_seed(0)
    model = C.rezero()
    for b in model.blocks:  # the scale and the branch it multiplies both at zero: neither can move
        torch.nn.init.zeros_(b.fc.weight)
        torch.nn.init.zeros_(b.fc.bias)
    series, found = _run(model, lambda: C.train_dense(model, 4, torch.optim.Adam(model.parameters(), 1e-2)))
    assert ("dead_activation", "blocks.0.fc") in kinds(found)
    f = next(f for f in found if f.module == "blocks.0.fc")
    assert "exactly zero: a zero-initialised layer" in f.message and "negative" not in f.message
    assert series.params["blocks.0.fc.weight"].weight_norm == [0.0] * 4
    assert series.params["blocks.0.gate.alpha"].weight_norm == [0.0] * 4


# -- a learning-rate spike in one layer ------------------------------------------------------


def _spike(factor: float, spike: bool = True) -> tuple[RunSeries, list[StatsFinding]]:
    torch.manual_seed(0)
    model = C.Deep()
    opt, lr_of = C.lr_spike_in_one_layer(model, spike=spike, factor=factor)
    return _run(model, lambda: C.train_dense(model, 31, opt, dim=32, lr_of=lr_of), every=5)


def test_a_learning_rate_spike_in_one_layer_is_advised_citing_that_layer():
    series, found = _spike(1000.0)
    f = next(f for f in found if f.kind == "exploding_update")
    assert (f.module, f.step) == (C.SPIKE_LAYER, C.SPIKE_STEP)
    assert "learning rate" in f.action and C.SPIKE_LAYER in f.action and "clip" in f.action
    ratio = series.params[f"{C.SPIKE_LAYER}.weight"].update_ratio
    k = series.steps.index(C.SPIKE_STEP)
    earlier = sorted(ratio[:k])  # steps 0, 5, 10, 15
    median = (earlier[1] + earlier[2]) / 2
    assert f.based_on == [f"{C.SPIKE_LAYER}.weight: update/weight ratio {ratio[k]:.3g} at step {C.SPIKE_STEP}, "
                          f"{ratio[k] / median:.3g}x its median {median:.3g} over the earlier 4 sampled steps"]
    # The other layers' updates stayed normal.
    assert all(max(c.update_ratio) < 0.1 for p, c in series.params.items() if not p.startswith(C.SPIKE_LAYER))
    assert _spike(1000.0, spike=False)[1] == []


def test_activations_blown_up_by_one_layer_spike_get_that_layers_learning_rate():
    series, found = _spike(1e5)
    scale = [f for f in found if f.kind in ("exploding_activation", "exploding_gradient")]
    assert scale, kinds(found)
    for f in scale:
        assert C.SPIKE_LAYER in f.action and "learning rate" in f.action and "initialisation" not in f.action
        assert not any("whole model changed at once" in b or "no update spike" in b for b in f.based_on)
        assert any(b.startswith(f"{C.SPIKE_LAYER}.weight: update/weight ratio") for b in f.based_on)


def test_the_root_and_its_head_outputting_one_tensor_count_once_in_a_jump():
    from modulelens.stats.advice import activation_jump

    def act(rms: list[float]) -> dict:
        return {"activation": {"rms": rms, "mean": [0.0, 0.0], "min": [-1.0, -1.0], "max": [1.0, 1.0],
                               "zero_frac": [0.0, 0.0], "input_rms": 1.0, "gain": 1.0}, "gradient": {"rms": 1e-2}}

    same = act([1.0, 50.0])
    mods = {"": same, "l0": act([1.0, 1.0]), "l1": act([1.0, 1.0]), "l2": act([1.0, 1.0]), "head": same}
    jumped, compared = activation_jump(series_of([0, 5], mods), 1, 10.0)
    assert (jumped, compared) == (["head"], 4)  # not 2 of 5: the root's output is the head's


def _param(module: str, grad: list, shape=(4, 4)) -> dict:
    n = len(grad)
    return {"module": module, "shape": list(shape), "weight_norm": [1.0] * n, "grad_norm": grad,
            "grad_to_weight": [g if g is None else g / 1.0 for g in grad], "update_ratio": [0.0] * n}


def _module(grad_rms, ran: bool = True) -> dict:
    act = {"rms": 1.0, "input_rms": 1.0, "gain": 1.0, "zero_frac": 0.0, "min": -1.0, "max": 1.0, "count": 16}
    if not ran:
        act = {k: None for k in act}
    return {"activation": act, "gradient": {"rms": grad_rms}}


def test_a_zero_gradient_at_a_modules_output_is_told_apart_from_a_cut_graph():
    mods = {"": _module(1e-2), "enc": _module(0.0), "head": _module(1e-2)}
    params = {"enc.weight": _param("enc", [0.0, 0.0, 0.0]), "head.weight": _param("head", [0.1, 0.1, 0.1])}
    [f] = F.evaluate(series_of([0, 5, 10], mods, params=params))
    assert (f.kind, f.module, f.evidence["grad"], f.steps_held) == ("no_gradient", "enc", "exactly zero", 3)
    assert "exactly zero" in f.message and "cut at the output" not in f.message
    assert any("output of enc is exactly zero" in b for b in f.based_on)


def test_a_module_that_did_not_run_is_not_a_cut_graph():
    mods = {"": _module(1e-2), "branch": _module(None, ran=False), "head": _module(1e-2)}
    params = {"branch.weight": _param("branch", [None, None, None]), "head.weight": _param("head", [0.1, 0.1, 0.1])}
    assert F.evaluate(series_of([0, 5, 10], mods, params=params)) == []
    mods["branch"] = _module(None)  # it ran, and no gradient reached it
    assert kinds(F.evaluate(series_of([0, 5, 10], mods, params=params))) == [("no_gradient", "branch")]
