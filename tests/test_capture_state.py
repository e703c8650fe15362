"""Capture and replay of state beyond the obvious: constructor objects as they are at the call,
module attributes set after construction, state a forward mutates, compact mismatch details."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

import modulelens
from modulelens.capture import capture_manifest


@dataclasses.dataclass
class ScaleConfig:
    width: int = 8
    mode: str = "plain"

    def __post_init__(self):
        self._derived = self.width * 2  # set by __post_init__, not a field


class Scaled(nn.Module):
    def __init__(self, cfg: ScaleConfig):
        super().__init__()
        self.cfg = cfg
        self.lin = nn.Linear(cfg.width, cfg.width)
        self.gain = 1.0

    def forward(self, x):
        y = self.lin(x) * self.gain
        if getattr(self.cfg, "_impl_internal", None) == "fast":  # a private attribute set after building
            y = y + 1
        if self.cfg.mode == "double":
            y = y * 2
        return y + self.cfg._derived


def test_constructor_objects_are_recorded_as_they_are_at_the_call(tmp_path):
    with modulelens.capture("", name="cfg", repo=tmp_path) as cap:
        cfg = ScaleConfig()
        model = Scaled(cfg)
        cfg.mode = "double"           # a declared field changed after construction
        cfg._impl_internal = "fast"   # an attribute outside the declared fields
        model.gain = 3.0              # a module attribute set after construction
        model(torch.randn(2, 8))
    man = capture_manifest(cap.artifact)
    fields = man.init.args[0]["fields"] if man.init.args else man.init.kwargs["cfg"]["fields"]
    assert fields["mode"] == "double" and fields["_impl_internal"] == "fast" and fields["_derived"] == 16
    assert man.attributes[""]["gain"] == 3.0
    rep = modulelens.replay_module("cfg", strategy="source", repo=str(tmp_path))
    assert rep.exact and rep.max_abs_error == 0.0


def test_mismatch_detail_is_compact_and_chunked(monkeypatch):
    from modulelens import numerics

    monkeypatch.setattr(numerics, "CHUNK_ELEMENTS", 1000)  # many chunks: the first bad index is global
    expected = torch.randn(4, 500, 300)
    actual = expected.clone()
    actual[3, 10, 7] += 1.0
    actual[3, 400, 0] = float("nan")
    d = numerics.diff(actual, expected, 1e-5, 1e-5)
    assert not d.allclose and d.max_abs_error == float("inf")
    assert "first at index [3, 10, 7]" in d.detail and "2 of 600000" in d.detail and "float32" in d.detail
    assert len(d.detail) < 300
    same = numerics.diff(expected, expected.clone(), 0.0, 0.0)
    assert same.allclose and same.max_abs_error == 0.0 and same.detail == ""
    assert len(numerics.short_repr(expected)) < 60


class RowWise(nn.Module):
    """Treats batch rows independently."""

    def __init__(self, dim: int = 64):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(torch.relu(self.lin(x)))


BUDGET = 64 * 1024  # bytes: the 256 x 64 float32 input and output (128 KiB) are over it


def test_over_the_budget_a_batch_independent_module_is_captured_on_its_first_rows(tmp_path):
    with modulelens.capture("", name="rows", repo=tmp_path, max_capture_bytes=BUDGET) as cap:
        RowWise()(torch.randn(256, 64))
    man = capture_manifest(cap.artifact)
    assert man.activations.mode == "batch_slice" and man.activations.batch_rows == 256
    rows = man.activations.rows
    assert 1 <= rows < 256 and "treats batch rows independently" in man.activations.reason
    assert man.inputs.tensor_leaves()[0].shape == [rows, 64] and man.output_leaves()[0].shape == [rows, 64]
    for strategy in ("source", "export"):
        rep = modulelens.replay_module("rows", strategy=strategy, repo=str(tmp_path))
        assert rep.compared and rep.exact and rep.max_abs_error == 0.0
        assert any("batch_slice" in n for n in rep.notes)


def test_over_the_budget_batchnorm_in_training_falls_back_to_shape_only(tmp_path):
    with modulelens.capture("", name="bn", repo=tmp_path, max_capture_bytes=BUDGET) as cap:
        model = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64)).train()
        before = model[1].running_mean.clone()
        model(torch.randn(256, 64))
    assert not torch.equal(model[1].running_mean, before)  # the real call's statistics were kept
    man = capture_manifest(cap.artifact)
    assert man.activations.mode == "shape_only" and "does not treat batch rows independently" in man.activations.reason
    assert not man.output_leaves()[0].stored and man.output_leaves()[0].stats.std is not None
    rep = modulelens.replay_module("bn", strategy="source", repo=str(tmp_path))
    assert not rep.compared and not rep.match


def test_batchnorm_running_statistics_are_compared_after_replay(tmp_path):
    with modulelens.capture("", name="bnstate", repo=tmp_path):
        nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).train()(torch.randn(16, 8))
    for strategy in ("source", "export"):
        rep = modulelens.replay_module("bnstate", strategy=strategy, repo=str(tmp_path))
        assert rep.exact, (strategy, rep.state, rep.notes)
        assert {s.name for s in rep.state} == {"module.1.running_mean", "module.1.running_var",
                                               "module.1.num_batches_tracked"}
        assert any("buffer(s) the forward changed" in c for c in rep.compared_values)


class KVStore:
    """A user class holding tensors, as caches are: torch.export does not take it as an argument."""

    def __init__(self, keys: torch.Tensor):
        self.keys = keys


class Appender(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, store: KVStore):
        store.keys = torch.cat([store.keys, self.proj(x)], dim=0)  # replaced, as a cache grows
        return store.keys.sum(0), store


def test_an_argument_object_holding_tensors_replays_by_export_with_its_changes(tmp_path):
    with modulelens.capture("", name="kv", repo=tmp_path) as cap:
        Appender()(torch.randn(2, 4), KVStore(torch.zeros(1, 4)))
    man = capture_manifest(cap.artifact)
    assert man.export.ok and man.export.calling == "leaves" and "args.1.keys" in man.state_after
    for strategy in ("source", "export"):
        rep = modulelens.replay_module("kv", strategy=strategy, repo=str(tmp_path))
        assert rep.exact, (strategy, rep.notes)
        assert [s.name for s in rep.state] == ["args.1.keys"] and rep.state[0].shape == [3, 4]
        assert {o.name for o in rep.outputs} == {"output.0", "output.1.keys"}
