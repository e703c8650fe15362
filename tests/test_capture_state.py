"""Capture and replay of state beyond the obvious: constructor objects as they are at the call,
module attributes set after construction, state a forward mutates, compact mismatch details."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

import modulelens
from modulelens.capture.manifest import capture_manifest


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
