"""In-process capture details: targets, call index, value recording, what cannot be recorded."""

from __future__ import annotations

import dataclasses
import enum

import pytest
import torch
import torch.nn as nn

import modulelens
from modulelens.capture import capture_manifest
from modulelens.capture.tracer import Target
from modulelens.capture import Decoder, Encoder, TensorSink, TensorSource
from modulelens.capture.sources import Resolver, definitions_source


class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


@dataclasses.dataclass
class Inner:
    width: int = 4
    dtype: torch.dtype = torch.float64


@dataclasses.dataclass
class Cfg:
    dims: tuple = (8, 8)
    mode: Mode = Mode.FAST
    inner: Inner = dataclasses.field(default_factory=Inner)
    table: dict = dataclasses.field(default_factory=lambda: {"a": [1, 2.5, None], 3: "x"})


class Layer(nn.Module):
    def __init__(self, cfg: Cfg, scale: float = 1.0, act=nn.GELU):
        super().__init__()
        self.lin = nn.Linear(cfg.dims[0], cfg.dims[1])
        self.act = act()
        self.scale = scale

    def forward(self, x, *, bias=None):
        y = self.act(self.lin(x)) * self.scale
        return {"y": y if bias is None else y + bias, "aux": (y.sum(), 3)}


class Net(nn.Module):
    def __init__(self, n: int, cfg: Cfg):
        super().__init__()
        self.layers = nn.ModuleList([Layer(cfg, scale=i + 1.0) for i in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, bias=torch.ones(8))["y"]
        return x


def test_target_kinds():
    lin = nn.Linear(2, 2)
    assert Target("layers.1").matches("layers.1", lin)
    assert not Target("layers.1").matches("layers.10", lin)
    assert Target("layers.*.lin").matches("layers.3.lin", lin)
    assert not Target("layers.*").matches("layers.3.lin", lin)
    assert Target("type:Linear").matches("anything", lin)
    assert Target("type:torch.nn.modules.linear.Linear").matches("x", lin)
    assert Target("").matches("", lin) and not Target("").matches("a", lin)


@pytest.mark.parametrize("target,call,expect_path,expect_scale", [
    ("layers.1", 1, "layers.1", 2.0),
    ("layers.*", 3, "layers.2", 3.0),
    ("type:Layer", 2, "layers.1", 2.0),
])
def test_targets_and_call_index(tmp_path, target, call, expect_path, expect_scale):
    torch.manual_seed(0)
    with modulelens.capture(target, call=call, name="t", repo=tmp_path) as cap:
        net = Net(3, Cfg())
        net(torch.randn(2, 8))
    m = cap.artifact.raw_manifest
    assert m["module_path"] == expect_path
    assert m["init"]["kwargs"]["scale"] == expect_scale
    assert m["inputs"]["kwargs"]["items"][0][0] == "bias"
    rep = modulelens.replay_module("t", strategy="source", repo=str(tmp_path))
    assert rep.exact and len(rep.outputs) == 3  # y, aux sum, aux int


def test_call_index_beyond_calls_is_a_clear_error(tmp_path):
    with pytest.raises(modulelens.ModuleLensError, match="fewer than the call index 5"):
        with modulelens.capture("layers.0", call=5, repo=tmp_path):
            Net(2, Cfg())(torch.randn(1, 8))


def test_values_round_trip():
    value = {
        "cfg": Cfg(), "t": torch.arange(6.0).reshape(2, 3).t(), "dt": torch.bfloat16, "dev": torch.device("cpu"),
        "size": torch.Size([2, 3]), "nan": float("nan"), "cls": nn.ReLU, "fn": torch.nn.functional.gelu,
        "sl": slice(1, None, 2), "cx": 1 + 2j,
    }
    sink = TensorSink()
    spec = Encoder(sink).encode(value, "v")
    import json

    spec = json.loads(json.dumps(spec))  # survives JSON
    out = Decoder(TensorSource(sink.tensors), Resolver()).decode(spec)
    assert out["cfg"] == value["cfg"]
    assert torch.equal(out["t"], value["t"]) and out["t"].stride() == value["t"].stride()  # layout kept
    assert out["dt"] is torch.bfloat16 and out["size"] == torch.Size([2, 3]) and out["cls"] is nn.ReLU
    assert out["fn"] is torch.nn.functional.gelu and out["sl"] == slice(1, None, 2) and out["cx"] == 1 + 2j
    assert out["nan"] != out["nan"]


class TakesLambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.fn(self.lin(x))


def test_unrecordable_argument_is_reported_and_export_still_works(tmp_path):
    with modulelens.capture("", name="lam", repo=tmp_path) as cap:
        m = TakesLambda(lambda x: x * 2)
        m(torch.randn(3, 4))
    man = cap.artifact.raw_manifest
    assert man["strategies"] == ["export"]
    assert any("init.fn" in u and "lambda" in u for u in man["unrecorded"])
    assert any("source replay is unavailable" in n for n in man["notes"])
    rep = modulelens.replay_module("lam", repo=str(tmp_path))
    assert rep.strategy == "export" and rep.exact
    with pytest.raises(modulelens.ModuleLensError, match="does not support the source strategy"):
        modulelens.replay_module("lam", strategy="source", repo=str(tmp_path))


def test_module_built_before_recording_still_captures(tmp_path):
    m = TakesLambda(torch.tanh)  # built outside the context: no constructor record
    with modulelens.capture("", name="late", repo=tmp_path) as cap:
        m(torch.randn(3, 4))
    m = capture_manifest(cap.artifact)
    assert m.strategies == ["export"]
    assert any("were not recorded" in n for n in m.notes)


def test_inputs_snapshotted_before_an_inplace_forward(tmp_path):
    class AddInPlace(nn.Module):
        def forward(self, x):
            x.add_(1.0)
            return x * 2

    x = torch.zeros(3)
    with modulelens.capture("", name="inplace", repo=tmp_path):
        AddInPlace()(x)
    rep = modulelens.replay_module("inplace", repo=str(tmp_path))
    assert rep.exact  # replay saw zeros, as the real call did


def test_dropout_in_training_mode_replays_bit_for_bit(tmp_path):
    with modulelens.capture("", name="drop", repo=tmp_path):
        m = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)).train()
        torch.rand(5)  # move the RNG somewhere arbitrary
        m(torch.randn(4, 16))
    for strategy in ("source", "export"):
        rep = modulelens.replay_module("drop", strategy=strategy, repo=str(tmp_path))
        assert rep.exact, strategy


def test_definitions_source_skips_top_level_work():
    src = "import torch\nX = 3\nY = torch.zeros(2)\nclass A: pass\ntrain()\nfor i in range(3):\n    pass\n"
    out = definitions_source(src)
    assert "X = 3" in out and "class A" in out and "train()" not in out and "torch.zeros" not in out
    guarded = "import os\nZ = os.getcwd()\nif __name__ == '__main__':\n    train()\n"
    out = definitions_source(guarded)
    assert "Z = os.getcwd()" in out and "train()" not in out


def test_tag_capture(cli, tmp_path):
    with modulelens.capture("", name="tg", repo=tmp_path):
        nn.Linear(2, 2)(torch.randn(1, 2))
    with modulelens.capture("", name="tg", repo=tmp_path):
        nn.Linear(2, 2)(torch.randn(1, 2))
    code, data, r = cli("tag-capture", "tg:v1", "prod", "--repo", tmp_path, "--json")
    assert code == 0 and data["ref"] == "tg:v1", r.output
    code, data, _ = cli("show", "capture", "tg@prod", "--repo", tmp_path, "--json")
    assert data["version"] == 1 and data["aliases"] == ["prod"]
    code, err, _ = cli("tag-capture", "tg", "latest", "--repo", tmp_path, "--json")
    assert code == 2 and "automatically" in err["error"]
