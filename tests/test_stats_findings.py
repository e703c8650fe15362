"""Pure logic of modulelens.stats.findings: the rules over a stored series, on hand-made series."""

from __future__ import annotations

from typing import Any

from modulelens.stats import findings as F
from modulelens.stats.schema import RunSeries, StatsFinding


def series_of(steps: list[int], modules: dict[str, dict[str, Any]], nonfinite: list[dict] | None = None,
              params: dict[str, Any] | None = None) -> RunSeries:
    """A series with ``modules[name] = {"type": ..., "activation": {stat: [...]}, "gradient": {...}}``
    (a scalar stat is repeated over the steps)."""

    def cols(d: dict[str, Any]) -> dict[str, list[Any]]:
        return {k: (v if isinstance(v, list) else [v] * len(steps)) for k, v in d.items()}

    return RunSeries.model_validate({
        "steps": steps, "order": list(modules), "nonfinite": nonfinite or [], "params": params or {},
        "modules": {n: {"type": m.get("type", "Linear"), "activation": cols(m.get("activation", {})),
                        "gradient": cols(m.get("gradient", {})), "softmax": cols(m.get("softmax", {}))}
                    for n, m in modules.items()},
    })


def _healthy(gain: float = 1.0) -> dict[str, Any]:
    return {"activation": {"rms": 1.0 * gain, "input_rms": 1.0, "gain": gain, "zero_frac": 0.0, "min": -3.0,
                           "max": 3.0}, "gradient": {"rms": 1e-2}}


def kinds(found: list[StatsFinding]) -> list[tuple[str, str]]:
    return [(f.kind, f.module) for f in found]


def test_healthy_series_gives_no_findings():
    mods = {"": _healthy(), **{f"l{i}": _healthy() for i in range(5)}}
    assert F.evaluate(series_of([0, 10], mods)) == []


def test_dead_relu_is_blamed_on_the_innermost_module():
    mods = {"": _healthy(), "l0": _healthy(),
            "act": {"type": "ReLU", "activation": {"rms": 0.0, "input_rms": 1.0, "gain": 0.0, "zero_frac": 1.0,
                                                    "min": 0.0, "max": 0.0}, "gradient": {"rms": 1e-2}},
            "l1": _healthy()}
    assert ("dead_activation", "act") in kinds(F.evaluate(series_of([0], mods)))


def test_exploding_gain_and_the_first_nan():
    mods = {"": _healthy(), "l0": _healthy(), "l1": _healthy(gain=100.0), "l2": _healthy()}
    assert kinds(F.evaluate(series_of([0], mods))) == [("exploding_activation", "l1")]
    nan = [{"step": 5, "calls": [{"module": "l2", "input_nonfinite": False}, {"module": "", "input_nonfinite": True}],
            "grads": []}]
    found = F.evaluate(series_of([0, 5], mods, nonfinite=nan))
    assert found[0].kind == "nan_inf" and found[0].module == "l2" and found[0].step == 5


def test_a_finding_says_on_which_steps_it_held():
    grow = _healthy(gain=100.0)
    grow["activation"] = {k: [v, None, v, v] for k, v in grow["activation"].items()}  # not run on step 10
    grow["activation"]["gain"] = [100.0, None, 2.0, 100.0]
    mods = {"": _healthy(), "l0": _healthy(), "branch": grow}
    [f] = F.evaluate(series_of([0, 10, 20, 30], mods))
    assert (f.kind, f.module, f.first_step, f.last_step, f.steps_held, f.step) == \
        ("exploding_activation", "branch", 0, 30, 2, 30)


def test_shrinking_raw_inputs_to_unit_scale_is_not_vanishing():
    raw = {"activation": {"rms": 1.0, "input_rms": 2e4, "gain": 5e-5, "zero_frac": 0.0, "min": -3.0, "max": 3.0},
           "gradient": {"rms": 1e-2}}
    mods = {"": {**raw}, "bn": raw, "fc": _healthy()}
    assert F.evaluate(series_of([0], mods)) == []
    tiny = {"activation": {**raw["activation"], "rms": 1e-3, "input_rms": 2.0}, "gradient": {"rms": 1e-2}}
    assert kinds(F.evaluate(series_of([0], {"": _healthy(), "bn": tiny, "fc": _healthy()}))) == \
        [("vanishing_activation", "bn")]


def test_gradients_are_judged_against_the_healthy_layers_near_the_loss():
    # Gradients fade 10x per layer going backward: the median over all layers sits in the vanished
    # part; the layers near the loss are healthy, not exploding.
    mods = {"": _healthy(), **{f"l{k}": {**_healthy(), "gradient": {"rms": 10.0 ** (k - 12)}} for k in range(13)}}
    found = F.evaluate(series_of([0], mods))
    assert [f.kind for f in found] == ["vanishing_gradient"]
    assert int(found[0].module[1:]) < 10 and "clip" not in found[0].action


def test_a_rerun_that_found_the_origin_names_it_and_one_that_did_not_says_so():
    from modulelens.stats.schema import NanOrigin

    mods = {"": _healthy(), "l0": _healthy(), "l1": _healthy(), "l2": _healthy()}
    nan = [{"step": 10, "calls": [{"module": "l0", "input_nonfinite": False}], "grads": []}]
    series = series_of([0, 5, 10], mods, nonfinite=nan)
    series.nan_origin = NanOrigin(found=True, step=7, phase="backward", tensor="gradient", module="l1",
                                  seen_in="gradient w.r.t. the input of l1", detail="Its backward made them.")
    [f] = F.evaluate(series)
    assert (f.kind, f.module, f.step, f.phase, f.tensor, f.found_by) == ("nan_inf", "l1", 7, "backward", "gradient", "rerun")
    assert (f.first_step, f.evidence["first_seen_step"]) == (10, 10) and "backward of l1" in f.action
    series.nan_origin = NanOrigin(found=False, detail="the rerun reached step 10 without NaN/Inf")
    [f] = F.evaluate(series)
    assert (f.module, f.step, f.found_by) == ("l0", 10, "sampled steps") and "did not: the rerun reached" in f.message
