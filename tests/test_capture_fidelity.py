"""Capture fidelity on the long tail: inputs that were activations and are changed in place, options
held in plain Python containers, values that cannot be recorded, custom operators in exported
programs, and the batch dimension found from the run (sequence-first layouts, with backward)."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest
import torch
import torch.nn as nn

import modulelens
from conftest import run_cli_subprocess
from modulelens.capture.custom_ops import import_op_modules
from modulelens.capture import capture_manifest
from modulelens.errors import ReplayFailed
from modulelens.repo import Repository


@dataclasses.dataclass
class GateConfig:
    dim: int = 8
    scaled: set = dataclasses.field(default_factory=lambda: {"gate", "proj"})
    factor: float = 1.5


class InPlaceGate(nn.Module):
    """Scales its input in place when the config's set-valued option says so (as Mixtral's router
    jitter does): allowed in the run, where the input is an activation."""

    def __init__(self, config: GateConfig):
        super().__init__()
        self.config = config
        self.gate = nn.Linear(config.dim, config.dim)

    def forward(self, x):
        if "gate" in self.config.scaled:
            x *= self.config.factor
        return torch.sigmoid(self.gate(x)) * x


class Net(nn.Module):
    def __init__(self, config: GateConfig):
        super().__init__()
        self.pre = nn.Linear(config.dim, config.dim)
        self.block = InPlaceGate(config)

    def forward(self, x):
        return self.block(self.pre(x)).sum()


def test_a_block_changing_an_activation_in_place_and_reading_a_set_option_replays_exactly(tmp_path):
    torch.manual_seed(0)
    with modulelens.capture("block", name="gate", repo=tmp_path, backward=True):
        net = Net(GateConfig())
        net(torch.randn(3, 8)).backward()
        net(torch.randn(3, 8))  # the next step ends the capture
    man = capture_manifest(Repository(tmp_path).open("captures", "gate"))
    assert man.strategies == ["source", "export"] and man.unrecorded == []
    assert man.inputs.tensor_leaves()[0].leaf is False and "args.0" in man.state_after
    for strategy in ("source", "export"):
        rep = modulelens.replay_module("gate", strategy=strategy, backward=strategy == "source", repo=str(tmp_path))
        assert rep.match and rep.exact and rep.max_abs_error == 0.0, (strategy, rep.notes)
        assert [s.name for s in rep.state] == ["args.0"] and rep.state[0].max_abs_error == 0.0
    assert rep.backward is None
    grads = modulelens.replay_module("gate", strategy="source", backward=True, repo=str(tmp_path))
    assert grads.backward_match and {b.name for b in grads.backward} >= {"grad_input.0", "param.gate.weight"}


class Settings:
    """A config object with a field the encoder cannot store (a lock)."""

    def __init__(self, dim: int):
        self.dim = dim
        self.lock = threading.Lock()
        self.scale = 2.0


class IgnoresLock(nn.Module):
    def __init__(self, settings: Settings):
        super().__init__()
        self.settings = settings
        self.lin = nn.Linear(settings.dim, settings.dim)

    def forward(self, x):
        return self.lin(x) * self.settings.scale


class ReadsLock(IgnoresLock):
    def forward(self, x):
        with self.settings.lock:
            return self.lin(x)


class BuiltWithLock(IgnoresLock):
    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.was_locked = settings.lock.locked()  # the constructor uses it; the forward does not


def _capture(cls, tmp_path, name):
    with modulelens.capture("", name=name, repo=tmp_path):
        cls(Settings(4))(torch.randn(2, 4))
    return modulelens.show_capture(name, repo=str(tmp_path))


def test_an_unrecorded_config_field_costs_source_replay_only_when_the_call_reads_it(tmp_path):
    shown = _capture(IgnoresLock, tmp_path, "ignores")
    assert shown.strategies == ["source", "export"]
    (line,) = shown.unrecorded
    assert line.startswith("init.settings.lock (_thread:lock") and "blocks nothing" in line
    rep = modulelens.replay_module("ignores", strategy="source", repo=str(tmp_path))
    assert rep.exact and rep.strategy == "source"

    shown = _capture(ReadsLock, tmp_path, "reads")
    assert shown.strategies == ["export"]
    assert "init.settings.lock" in shown.unrecorded[0] and "blocks source" in shown.unrecorded[0]
    assert any("init.settings.lock" in n and "source replay is unavailable" in n for n in shown.notes)
    man = capture_manifest(Repository(tmp_path).open("captures", "reads"))
    (field,) = man.unrecorded_values
    assert (field.path, field.blocks, field.read_by_call) == ("init.settings.lock", ["source"], True)

    shown = _capture(BuiltWithLock, tmp_path, "built")
    assert shown.strategies == ["source", "export"]  # the call does not read it
    with pytest.raises(ReplayFailed, match=r"uses init\.settings\.lock \(a _thread:lock\), which was not recorded"):
        modulelens.replay_module("built", strategy="source", repo=str(tmp_path))
    rep = modulelens.replay_module("built", repo=str(tmp_path))
    assert rep.strategy == "export" and rep.exact and "init.settings.lock" in rep.attempts[0].error


def test_a_program_with_a_custom_operator_loads_in_a_fresh_process(tmp_path):
    from custom_op_block import ScaledTanhBlock

    with modulelens.capture("", name="op", repo=tmp_path), torch.no_grad():
        ScaledTanhBlock(6)(torch.randn(3, 6))
    man = capture_manifest(Repository(tmp_path).open("captures", "op"))
    assert man.export.custom_ops == {"mltest::scaled_tanh": ["custom_op_lib"]}
    # a fresh interpreter has not imported custom_op_lib: replay imports it before loading the program
    proc = run_cli_subprocess("replay-module", "op", "--strategy", "export", "--repo", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["exact"] is True


def test_a_custom_operator_still_missing_is_named_with_the_module_to_import():
    with pytest.raises(ReplayFailed, match="custom operator mltest::not_there") as e:
        import_op_modules({"mltest::not_there": ["no_such_kernels_module"]}, __import__)
    assert "import no_such_kernels_module" in e.value.hint and "No module named" in str(e.value)


class SeqFirstEncoder(nn.Module):
    """Sequence-first layout: [seq, batch, dim]; attention mixes positions, not batch entries."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=False)

    def forward(self, x):
        return self.layer(x)


def test_a_batch_slice_along_dimension_1_replays_exactly_with_its_gradients(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(12, 10, 16, requires_grad=True)  # 12 positions, 10 sequences
    weight_bytes = sum(t.numel() * t.element_size() for t in SeqFirstEncoder().state_dict().values())
    with modulelens.capture("", name="seqfirst", repo=tmp_path, backward=True,
                            max_capture_bytes=weight_bytes + 8_000):  # the activations take 15 KiB
        model = SeqFirstEncoder()
        model(x).pow(2).sum().backward()
        model(x)
    man = capture_manifest(Repository(tmp_path).open("captures", "seqfirst"))
    act = man.activations
    assert act.mode == "batch_slice" and act.batch_dim == 1 and act.batch_rows == 10 and act.rows < 10, act.reason
    assert "along dimension 1" in act.reason and "tried first along dimension 0" in act.reason
    assert man.inputs.tensor_leaves()[0].shape == [12, act.rows, 16]
    assert modulelens.replay_module("seqfirst", strategy="export", repo=str(tmp_path)).exact
    rep = modulelens.replay_module("seqfirst", strategy="source", backward=True, repo=str(tmp_path))
    assert rep.exact and rep.max_abs_error == 0.0
    assert rep.backward_match and {b.name for b in rep.backward} >= {"grad_input.0", "param.layer.linear1.weight"}
    assert all(b.max_abs_error == 0.0 for b in rep.backward)


def test_inputs_alone_over_the_budget_keep_their_first_rows_as_activations_with_gradients(tmp_path):
    """The inputs are sliced before the call (they alone exceed the budget); they stay activations
    that require grad, the in-place gate reruns without the module hook, and the gradients are the
    slice's."""
    torch.manual_seed(0)
    with modulelens.capture("block", name="rows", repo=tmp_path, backward=True, export=False, max_capture_bytes=1200):
        net = Net(GateConfig())
        net(torch.randn(64, 8)).backward()
        net(torch.randn(64, 8))
    man = capture_manifest(Repository(tmp_path).open("captures", "rows"))
    (spec,) = man.inputs.tensor_leaves()
    assert man.activations.mode == "batch_slice" and spec.shape == [man.activations.rows, 8]
    assert spec.requires_grad and not spec.leaf and man.backward.grad_input == [True]
    assert any("computed by running it again" in n for n in man.notes)
    rep = modulelens.replay_module("rows", strategy="source", backward=True, repo=str(tmp_path))
    assert rep.exact and rep.backward_match and all(b.max_abs_error == 0.0 for b in rep.backward)
