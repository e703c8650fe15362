"""Training statistics in-process: the statistics against scipy/numpy, the hook machinery of the
Python API (sampled steps only, in-place activations, execution order, findings), and statistics
over a capture."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import scipy.stats
import torch
import torch.nn as nn
from conftest import EXAMPLES
from torch.nn.modules import module as nn_module

from modulelens.stats import StatsCollector, tensor_stats
from modulelens.stats import stats as S
from modulelens.stats.collector import StopRun
from modulelens.stats.order import combine_order
from modulelens.stats.findings import evaluate
from modulelens.stats.schema import RunSeries
from modulelens.stats.series import build_series


def _load_faults():
    spec = importlib.util.spec_from_file_location("faults_train", EXAMPLES / "faults" / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


faults = _load_faults()


# --------------------------------------------------------------------------------------------
# Statistics against scipy / numpy
# --------------------------------------------------------------------------------------------


def _reference(x: np.ndarray) -> dict:
    finite = x[np.isfinite(x)].astype(np.float64)
    mean, std = finite.mean(), finite.std()
    return {
        "mean": mean, "std": std,
        "skew": scipy.stats.skew(finite, bias=True),
        "kurtosis": scipy.stats.kurtosis(finite, fisher=True, bias=True),
        "zero_frac": float((x == 0).mean()), "min": finite.min(), "max": finite.max(),
        "nan": int(np.isnan(x).sum()), "inf": int(np.isinf(x).sum()), "count": finite.size,
        "rms": math.sqrt(float((finite**2).mean())),
        "kl_gauss": math.log(1 / std) + (std**2 + mean**2 - 1) / 2,
    }


def _samples():
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(4000, generator=g) * 2.5 + 0.7
    expo = torch.empty(3000).exponential_(1.5, generator=g)
    relu = torch.relu(torch.randn(64, 50, generator=g))  # many exact zeros
    uniform = torch.rand(7, 11, 13, generator=g, dtype=torch.float64)
    heavy = torch.distributions.StudentT(3.0).sample((5000,))
    bf16_relu = torch.relu(torch.randn(3000, generator=g)).to(torch.bfloat16)
    special = torch.randn(1000, generator=g)
    special[::97] = float("nan")
    special[5] = float("inf")
    special[6] = -float("inf")
    half = (torch.randn(2048, generator=g) * 3).to(torch.bfloat16)
    offset = torch.randn(5000, generator=g) * 1e-3 + 1000.0  # large mean vs std: centred moments matter
    return {"normal": normal, "exponential": expo, "relu": relu, "uniform64": uniform, "student_t": heavy,
            "nan_inf": special, "bfloat16": half, "bf16_relu": bf16_relu, "offset": offset}


@pytest.mark.parametrize("path", ["one pass", "pytorch"])
@pytest.mark.parametrize("name", list(_samples()))
def test_statistics_match_scipy_and_numpy(name, path, monkeypatch):
    if path == "pytorch":  # without a C compiler (and on GPUs) the statistics come from PyTorch operators
        monkeypatch.setattr(S, "moments_cpu", lambda *args: None)
    t = _samples()[name]
    got = tensor_stats(t)
    ref = _reference(t.to(torch.float64).numpy())
    for key in ("mean", "std", "skew", "kurtosis", "min", "max", "rms", "kl_gauss"):
        assert got[key] == pytest.approx(ref[key], rel=1e-6, abs=1e-9), key
    for key in ("zero_frac", "nan", "inf", "count"):
        assert got[key] == ref[key], key


def test_kl_matches_numerical_integration():
    mean, std = 0.8, 1.7
    t = torch.randn(200_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * std + mean
    got = tensor_stats(t)
    m, s = got["mean"], got["std"]
    p = scipy.stats.norm(m, s)
    q = scipy.stats.norm(0, 1)
    from scipy.integrate import quad

    numeric, _ = quad(lambda x: p.pdf(x) * (p.logpdf(x) - q.logpdf(x)), m - 12 * s, m + 12 * s)
    assert got["kl_gauss"] == pytest.approx(numeric, rel=1e-6)
    assert tensor_stats(torch.randn(100_000, generator=torch.Generator().manual_seed(2)))["kl_gauss"] < 1e-3


@pytest.mark.parametrize("name", ["normal", "relu", "nan_inf", "bfloat16"])
def test_device_path_matches_host_path(name, monkeypatch):
    """The GPU code path (everything on the device, one transfer at the end) run on CPU tensors."""
    t = _samples()[name]
    host = tensor_stats(t)
    monkeypatch.setattr(S, "HOST_PATH_DEVICES", set())
    vec = S.moments(t)
    assert isinstance(vec, torch.Tensor) and vec.dtype == torch.float64
    device = S.finalize(S.to_host([vec])[0])
    for key, value in host.items():
        assert device[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert tensor_stats(t, sample=500)["nan"] == host["nan"]


def test_merging_calls_equals_one_reduction():
    g = torch.Generator().manual_seed(3)
    parts = [torch.randn(n, generator=g) * s + o for n, s, o in ((100, 1.0, 0.0), (37, 5.0, 3.0), (1, 1.0, -2.0), (500, 0.1, 1.0))]
    parts.append(torch.tensor([float("nan"), 0.0, 0.0]))
    merged = S.finalize(S.merge_all(S.to_host([S.moments(p) for p in parts])))
    whole = tensor_stats(torch.cat(parts))
    for key, value in whole.items():
        assert merged[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_degenerate_tensors():
    const = tensor_stats(torch.full((10,), 3.0))
    assert const["std"] == 0 and const["skew"] is None and const["kurtosis"] is None and const["kl_gauss"] is None
    allnan = tensor_stats(torch.full((4,), float("nan")))
    assert allnan["count"] == 0 and allnan["nan"] == 4 and allnan["mean"] is None
    empty = tensor_stats(torch.empty(0))
    assert empty["count"] == 0 and empty["zero_frac"] is None


def test_sampled_moments_keep_counts_exact():
    g = torch.Generator().manual_seed(4)
    x = torch.relu(torch.randn(512, 1000, generator=g) * 2 + 0.3)
    x[7, 3] = float("nan")
    for t in (x, torch.nan_to_num(x)):
        exact, approx = tensor_stats(t), tensor_stats(t, sample=20_000)
        for key in ("zero_frac", "nan", "inf", "min", "max", "count"):
            assert approx[key] == exact[key], key
        for key in ("mean", "std", "rms"):
            assert approx[key] == pytest.approx(exact[key], rel=0.03), key
        assert approx["kurtosis"] == pytest.approx(exact["kurtosis"], rel=0.15)
    assert tensor_stats(x[:10], sample=20_000) == tensor_stats(x[:10])  # small tensors stay exact


def test_update_sample_takes_whole_rows_as_a_view():
    from modulelens.stats.updates import update_sample

    w = torch.randn(1024, 1024)
    s = update_sample(w)
    assert s.shape == (64, 1024) and s.data_ptr() == w.data_ptr()  # every 16th row, no copy
    assert torch.equal(s, w[::16])
    small = torch.randn(100, 100)
    assert torch.equal(update_sample(small), small.reshape(-1))  # exact below 65,536 elements
    long_rows = torch.randn(2, 300_000)  # rows too long: strided elements covering every column
    assert update_sample(long_rows).numel() <= 2 * S.DEFAULT_SAMPLE


def test_collector_samples_by_default_and_zero_is_exact():
    assert StatsCollector(nn.Linear(2, 2)).sample == S.DEFAULT_SAMPLE
    assert StatsCollector(nn.Linear(2, 2), sample=0).sample is None
    assert "sampling" in S.DEFINITIONS


def test_saturation_fraction():
    y = torch.tensor([0.995, -0.999, 0.5, 0.0, 0.98, 1.0])
    assert tensor_stats(y, S.SATURATING["Tanh"])["sat_frac"] == pytest.approx(3 / 6)
    s = torch.tensor([0.001, 0.999, 0.5, 0.2])
    assert tensor_stats(s, S.SATURATING["Sigmoid"])["sat_frac"] == pytest.approx(2 / 4)


# --------------------------------------------------------------------------------------------
# The collector
# --------------------------------------------------------------------------------------------


def _train(model, steps, stats=None, lr=1e-3, batch=32, d_in=16, d_out=4, check=None, opt=None):
    g = torch.Generator().manual_seed(0)
    opt = opt or torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
        x = torch.randn(batch, d_in, generator=g)
        loss = nn.functional.mse_loss(model(x), torch.zeros(batch, d_out))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if check is not None:
            check(step)
    return opt


def _mlp(fault="none", module="blocks.1.act", inplace=False, depth=3):
    torch.manual_seed(0)
    m = faults.MLP(16, 32, depth, 4, inplace=inplace)
    faults.plant(m, fault, module)
    return m


def _series(stats: StatsCollector) -> RunSeries:
    return build_series(stats.finish())


def test_hooks_only_on_sampled_steps_and_removed_after():
    model = _mlp()
    stats = StatsCollector(model, every=3, fx=False)
    installed = []

    def check(step):
        installed.append((len(nn_module._global_forward_hooks), len(nn_module._global_forward_pre_hooks)))

    stats.start()
    _train(model, 7, check=check)
    run = stats.finish()
    # After step k's optimizer.step(), hooks are present only when step k+1 is sampled.
    assert installed == [(0, 0), (0, 0), (1, 1), (0, 0), (0, 0), (1, 1), (0, 0)]
    assert [r.step for r in run.records] == [0, 3, 6]
    assert run.steps_seen == 7
    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks


def test_inplace_relu_activation_and_gradient():
    model = _mlp(inplace=True)
    stats = StatsCollector(model, every=1).start()
    _train(model, 2)
    series = _series(stats)
    fc, act = series.modules["blocks.0.fc"], series.modules["blocks.0.act"]
    # fc's output was recorded before the in-place ReLU overwrote it: it has negative values.
    assert fc.activation["min"][0] < 0 and act.activation["min"][0] == 0
    assert act.activation["zero_frac"][0] > 0.2
    # Gradient w.r.t. the ReLU input is zero where the ReLU clipped; w.r.t. its output it is not.
    assert fc.gradient["zero_frac"][0] == pytest.approx(act.activation["zero_frac"][0], abs=1e-6)
    assert act.gradient["zero_frac"][0] < 0.05
    assert series.params["blocks.0.fc.weight"].update_ratio[0] > 0
    assert evaluate(series) == []


def test_activation_and_gradient_values_are_exact():
    torch.manual_seed(0)
    lin = nn.Linear(5, 3)
    model = nn.Sequential(lin, nn.Tanh())
    x = torch.randn(8, 5)
    stats = StatsCollector(model, every=1, fx=False).start()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w0, b0 = lin.weight.detach().clone(), lin.bias.detach().clone()
    out = model(x)
    seen = {}
    h = out.register_hook(lambda g: seen.setdefault("g", g.clone()))
    (out**2).sum().backward()
    g_w = lin.weight.grad.clone()
    opt.step()
    h.remove()
    series = _series(stats)
    expected = tensor_stats(torch.nn.functional.linear(x, w0, b0))
    got = series.modules["0"].activation
    assert got["std"][0] == pytest.approx(expected["std"], rel=1e-5)
    assert series.modules["1"].gradient["std"][0] == pytest.approx(tensor_stats(seen["g"])["std"], rel=1e-6)
    assert series.modules["1"].activation["sat_frac"][0] is not None
    ratio = (0.1 * g_w.norm() / w0.norm()).item()
    assert series.params["0.weight"].update_ratio[0] == pytest.approx(ratio, rel=1e-5)
    assert series.params["0.weight"].grad_norm[0] == pytest.approx(g_w.norm().item(), rel=1e-6)
    assert series.params["0.weight"].weight_rms[0] == pytest.approx(w0.pow(2).mean().sqrt().item(), rel=1e-6)
    assert series.modules["0"].activation["input_rms"][0] == pytest.approx(x.pow(2).mean().sqrt().item(), rel=1e-6)


class Branchy(nn.Module):
    """Modules defined in a different order than they run, and data-dependent control flow (fx
    cannot trace it)."""

    def __init__(self):
        super().__init__()
        self.out = nn.Linear(16, 4)
        self.gate = nn.Linear(16, 16)
        self.inp = nn.Linear(8, 16)
        self.act = nn.ReLU()

    def forward(self, x):
        h = self.act(self.inp(x))
        if h.sum() > -1e9:  # depends on the data
            h = h * torch.sigmoid(self.gate(h))
        return self.out(h)


def test_collector_on_the_device_path_matches(monkeypatch):
    def run():
        model = _mlp(inplace=True)
        stats = StatsCollector(model, every=2, fx=False).start()
        _train(model, 3)
        return _series(stats)

    host = run()
    monkeypatch.setattr(S, "HOST_PATH_DEVICES", set())
    device = run()
    def same(a, b):
        return a == b if (a is None or b is None or isinstance(a, bool)) else a == pytest.approx(b, rel=1e-6, abs=1e-12)

    for name in host.order:
        for kind in ("activation", "gradient"):
            for stat, col in getattr(host.modules[name], kind).items():
                assert all(same(a, b) for a, b in zip(getattr(device.modules[name], kind)[stat], col)), (name, stat)
    for pname, info in host.params.items():
        for stat in ("update_ratio", "weight_norm", "grad_norm", "dead_rows"):
            assert all(same(a, b) for a, b in zip(getattr(device.params[pname], stat), getattr(info, stat))), (pname, stat)


def test_data_dependent_control_flow_uses_observed_order():
    model = Branchy()
    stats = StatsCollector(model, every=1).start()
    _train(model, 2, d_in=8)
    run = stats.finish()
    assert run.order_source == "observed"
    assert run.order == ["", "inp", "act", "gate", "out"]
    assert any("torch.fx could not trace" in n for n in run.notes)


class Reversed(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Linear(4, 2)
        self.b = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.a = nn.Linear(8, 4)

    def forward(self, x):
        self.last_input = x  # state set in forward: fx tracing must not leave a Proxy here
        return self.c(self.b(self.a(x)))


def test_fx_order_when_traceable():
    model = Reversed()
    stats = StatsCollector(model, every=1).start()
    _train(model, 1, d_in=8, d_out=2)
    run = stats.finish()
    assert run.order_source == "fx"
    assert run.order == ["", "a", "b", "b.0", "b.1", "c"]
    assert type(model.last_input) is torch.Tensor


def test_combine_order_keeps_unseen_modules_in_place():
    observed = ["", "x", "enc", "enc.0", "enc.1", "extra", "head"]
    fx = ["enc.1", "enc.0", "head"]
    assert combine_order(observed, fx) == ["", "x", "enc", "enc.1", "enc.0", "extra", "head"]


def test_healthy_model_gives_no_findings():
    model = _mlp(depth=4)
    stats = StatsCollector(model, every=2).start()
    _train(model, 9)
    series = _series(stats)
    assert series.steps == [0, 2, 4, 6, 8]
    assert evaluate(series) == []
    assert series.types["ReLU"].modules == ["blocks.0.act", "blocks.1.act", "blocks.2.act", "blocks.3.act"]
    # EMA: alpha * previous + (1 - alpha) * value, starting at the first value.
    raw = series.modules["blocks.0.act"].activation["std"]
    ema = series.modules["blocks.0.act"].activation_ema["std"]
    assert ema[0] == raw[0] and ema[1] == pytest.approx(0.9 * raw[0] + 0.1 * raw[1], rel=1e-6)


def _sigmoid_mlp(std: float, depth: int = 12) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        lin = nn.Linear(16, 16)
        nn.init.normal_(lin.weight, std=std)
        layers += [lin, nn.Sigmoid()]
    return nn.Sequential(*layers, nn.Linear(16, 4))


def test_saturation_finding():
    model = _sigmoid_mlp(std=3.0)  # pre-activations far beyond +-5: sigmoids stuck at 0 or 1
    stats = StatsCollector(model, every=1).start()
    _train(model, 1)
    found = evaluate(_series(stats))
    sat = [f for f in found if f.kind == "saturation"]
    assert sat and all(f.module in {str(i) for i in range(1, 24, 2)} for f in sat)
    assert all(f.evidence["sat_frac"] >= 0.5 and f.message and f.action for f in sat)


def test_vanishing_gradient_finding():
    model = _sigmoid_mlp(std=0.3)  # each layer scales the gradient by ~0.3: it fades toward the input
    stats = StatsCollector(model, every=1).start()
    _train(model, 1)
    found = evaluate(_series(stats))
    van = [f for f in found if f.kind == "vanishing_gradient"]
    assert len(van) == 1 and van[0].evidence["gradient_rms"] < 1e-3 * van[0].evidence["median_gradient_rms"]
    assert int(van[0].module) < 12  # in the first half of the network


def test_gradient_accumulation_merges_calls_and_max_steps_stops():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stats = StatsCollector(model, every=1, max_steps=2, fx=False).start()
    with pytest.raises(StopRun):
        for _ in range(5):
            for _ in range(2):  # two micro-batches per step
                model(torch.randn(4, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
    run = stats.finish()
    assert run.steps_seen == 2 and len(run.records) == 2
    assert run.records[0].modules["blocks.0.fc"].calls == 2
    assert run.records[0].modules["blocks.0.fc"].act[0] == 2 * 4 * 32


def test_forward_steps_without_optimizer_and_unregistered_modules():
    class Loose(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.helpers = [nn.ReLU()]  # not a registered submodule

        def forward(self, x):
            return self.helpers[0](self.fc(x))

    model = Loose()
    stats = StatsCollector(model, every=2, step_on="forward", fx=False).start()
    for _ in range(5):
        model(torch.randn(3, 4)).sum().backward()
    run = stats.finish()
    assert [r.step for r in run.records] == [0, 2, 4]
    assert run.order == ["", "fc", "<ReLU>"]  # named after its caller, the root
    assert all(r.modules[""].calls == 1 for r in run.records)

    stats = StatsCollector(model, every=2, step_on="manual", fx=False).start()
    for _ in range(4):
        model(torch.randn(3, 4)).sum().backward()
        stats.step()
    assert [r.step for r in stats.finish().records] == [0, 2]


def test_forward_steps_count_the_last_step_too():
    """Five model calls are five steps: the last one ends with the run (it used to be left out,
    steps_seen 4 with 5 sampled steps), and a max_steps stop is not counted twice."""
    model = nn.Linear(4, 4)
    stats = StatsCollector(model, every=1, step_on="forward", fx=False).start()
    for _ in range(5):
        model(torch.randn(3, 4)).sum().backward()
    run = stats.finish()
    assert run.steps_seen == 5 and [r.step for r in run.records] == [0, 1, 2, 3, 4]

    stats = StatsCollector(model, every=1, step_on="forward", fx=False, max_steps=3).start()
    with pytest.raises(StopRun):
        for _ in range(5):
            model(torch.randn(3, 4))
    assert stats.finish().steps_seen == 3


def test_auto_root_ignores_loss_modules_and_compiled_model_is_reported():
    model = _mlp()
    loss_fn = nn.MSELoss()
    stats = StatsCollector(every=1, fx=False).start()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn(model(torch.randn(4, 16)), torch.zeros(4, 4)).backward()
    opt.step()
    run = stats.finish()
    assert "" in run.order and run.types[""] == "MLP" and "MSELoss" not in run.types.values()

    compiled = torch.compile(_mlp(), backend="eager")
    stats = StatsCollector(every=1, fx=False).start()
    opt = torch.optim.SGD(compiled.parameters(), lr=0.01)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(torch.randn(4, 16)).sum().backward()
    opt.step()
    run = stats.finish()
    assert run.compiled and any("eager mode" in n for n in run.notes)


def test_python_api_saves_artifact(tmp_path):
    model = _mlp(fault="dead-relu", module="blocks.1.act")
    with StatsCollector(model, every=2, name="api-run", repo=tmp_path) as stats:
        _train(model, 5)
    assert stats.artifact.ref == "api-run:v1"
    assert [(f.kind, f.module) for f in stats.findings] == [("dead_activation", "blocks.1.act")]
    files = stats.artifact.raw_manifest["files"]
    assert {"series.json", "findings.json", "report.html", "report.png"} <= set(files)
    series = json.loads((stats.artifact.path / "series.json").read_text())
    assert series["steps"] == [0, 2, 4] and series["order_source"] == "fx"


def test_python_api_saves_when_the_loop_fails(tmp_path, monkeypatch):
    from modulelens.stats import report

    monkeypatch.setattr(report, "have_matplotlib", lambda: False)
    model = _mlp(fault="nan", module="blocks.0.fc")
    with pytest.raises(AssertionError, match="loss is not finite"):
        with StatsCollector(model, every=1, name="crash", repo=tmp_path) as stats:
            def check(step):
                assert step < 1, "loss is not finite"
            _train(model, 5, check=check)
    assert [(f.kind, f.module) for f in stats.findings] == [("nan_inf", "blocks.0.fc")]
    summary = stats.artifact.raw_manifest["summary"]
    assert any("AssertionError" in n for n in summary["notes"])
    # Without matplotlib: no PNG, and the HTML page says how to get the plots.
    assert "report.png" not in stats.artifact.raw_manifest["files"]
    import html

    assert html.escape(report.PLOTS_HINT) in (stats.artifact.path / "report.html").read_text()


# --------------------------------------------------------------------------------------------
# Over a capture
# --------------------------------------------------------------------------------------------


def test_gather_stats_over_a_capture(cli, tmp_path):
    import modulelens
    from modulelens.capture import load_tensors
    from modulelens.repo import Repository

    torch.manual_seed(0)
    with modulelens.capture("1", name="blk", repo=tmp_path, export=False) as cap:
        model = nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.Linear(16, 16), nn.ReLU()), nn.Linear(16, 2))
        model(torch.randn(32, 8))
    code, data, r = cli("gather-stats", "--capture", cap.artifact.ref, "--repo", tmp_path, "--json")
    assert code == 0, r.output
    assert data["source"] == "capture" and data["modules"] == 1 and data["findings"] == []
    rows = {t["key"]: t for t in data["tensors"]}
    assert {t["group"] for t in rows.values()} == {"input", "output", "weight"}
    weights = load_tensors(Repository(tmp_path).open("captures", cap.artifact.ref), "weights.safetensors")
    ref = tensor_stats(weights["0.weight"])
    assert rows["0.weight"]["std"] == pytest.approx(ref["std"], rel=1e-6)
    assert rows["0.weight"]["kurtosis"] == pytest.approx(
        scipy.stats.kurtosis(weights["0.weight"].double().numpy().ravel()), rel=1e-5)
    assert rows["output"]["zero_frac"] > 0.2
    assert data["run_id"] == "blk:v1" and data["report_html"].endswith("report.html")
    code, err, _ = cli("gather-stats", "--capture", "nope", "--repo", tmp_path, "--json")
    assert code == 2 and "nope" in err["error"]
