"""The capture manifest model: files written by the previous version load through it unchanged,
their value specs decode, and a damaged manifest is a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import modulelens
from modulelens.capture import CaptureManifest, capture_manifest
from modulelens.capture import Resolver
from modulelens.capture.spec import ModuleSpec
from modulelens.capture import Decoder, TensorSource
from modulelens.errors import ChecksumMismatch
from modulelens.registry import ToolContext
from modulelens.repo import Repository
from modulelens.tools.trust_artifact import TrustRequest, trust

FIXTURES = Path(__file__).parent / "fixtures"
MODEL_PY = Path(__file__).resolve().parent.parent / "examples" / "tinyformer" / "model.py"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", ["capture_manifest_blk.json", "capture_manifest_shape_only.json"])
def test_manifest_written_by_the_previous_version_loads_unchanged(name):
    stored = _fixture(name)
    m = CaptureManifest.model_validate(stored)
    assert m.model_dump(mode="json") == stored  # nothing lost, nothing added
    assert (m.schema_version, m.kind, m.version) == (1, "captures", 1)
    assert (m.module_path, m.class_path, m.strategies) == ("blocks.1", "model:Block", ["source", "export"])
    assert m.source.kind == "script" and m.source.argv[-2:] == ["--steps", "1"] and m.distributed is None
    assert m.export.ok and m.backward is None and m.training and m.input_tensors == 1
    assert isinstance(m.init, ModuleSpec) and m.init.cls == "model:Block" and m.init.bind_error is None
    assert [t.key for t in m.inputs.tensor_leaves()] == ["args.0"] and [t.key for t in m.output_leaves()] == ["output"]
    weights = m.weight_specs()
    assert len(weights) == 12 and all(w.parameter for w in weights.values() if w.requires_grad)


@pytest.mark.parametrize("name", ["capture_manifest_blk.json", "capture_manifest_shape_only.json"])
def test_value_specs_of_the_previous_version_decode(name):
    m = CaptureManifest.model_validate(_fixture(name))
    resolver = Resolver({"model": (MODEL_PY.read_text(), str(MODEL_PY))})
    data = {t.key: torch.zeros(t.shape) for t in [*m.inputs.tensor_leaves(), *m.output_leaves()] if t.stored}
    source = TensorSource(data)
    decoder = Decoder(source, resolver)
    args, kwargs = decoder.decode(m.inputs.args), decoder.decode(m.inputs.kwargs)
    output = decoder.decode(m.output_leaves()[0].to_json())
    assert kwargs == {} and args[0].shape == output.shape == (8, 32, 64) and args[0].requires_grad
    assert source.synthesized == ([] if name == "capture_manifest_blk.json" else ["args.0", "output"])

    assert m.init is not None
    block = resolver(m.init.cls)(*map(decoder.decode, m.init.args), **{k: decoder.decode(v) for k, v in m.init.kwargs.items()})
    assert isinstance(block, nn.Module) and type(block).__name__ == "Block"
    specs = m.weight_specs()
    weights = {n: TensorSource({s.key: torch.zeros(s.shape) for s in specs.values()}).get(s) for n, s in specs.items()}
    assert {n: tuple(t.shape) for n, t in weights.items()} == {n: tuple(t.shape) for n, t in block.state_dict().items()}


def test_manifest_of_an_earlier_minimal_file_gets_defaults():
    m = CaptureManifest.model_validate({"schema_version": 1, "kind": "captures", "name": "x", "version": 1})
    assert m.init is None and m.strategies == [] and m.inputs.tensor_leaves() == [] and m.weight_specs() == {}
    assert m.environment.device == "cpu" and m.source.kind == "script" and m.output_leaves() == []


def test_show_capture_returns_the_manifest_as_stored(tmp_path):
    with modulelens.capture("", name="lin", repo=tmp_path) as cap:
        nn.Linear(3, 2)(torch.randn(4, 3))
    assert cap.artifact is not None
    stored = json.loads((cap.artifact.path / "manifest.json").read_text())
    shown = modulelens.show_capture("lin", repo=str(tmp_path), full=True)
    assert shown.manifest == stored and shown.inputs[0].shape == [4, 3] and shown.weights == 2
    m = capture_manifest(cap.artifact)
    assert m.source.kind == "api" and m.init is not None and m.init.kwargs == {"in_features": 3, "out_features": 2}


@pytest.mark.parametrize("change,where", [
    ({"strategies": ["teleport"]}, "strategies.0"),
    ({"init": {"$": "module", "args": []}}, "init.cls"),
    ({"inputs": "nothing"}, "inputs"),
])
def test_damaged_manifest_is_a_clear_error(tmp_path, change, where):
    repo = Repository(tmp_path)
    art = repo.create("captures", "bad", lambda folder: {**_fixture("capture_manifest_blk.json"), **change})
    with pytest.raises(ChecksumMismatch, match=f"manifest of bad:v1 does not have the expected form \\({where}"):
        capture_manifest(repo.open("captures", art.ref))


def test_a_capture_written_by_the_previous_version_replays_by_source_and_export(tmp_path):
    """Schema 1: its export program holds its weights (no ``export.weights`` field); it is copied
    into a repository, trusted, and replayed exactly by both strategies, gradients included."""
    folder = tmp_path / "captures" / "seq"
    shutil.copytree(FIXTURES / "capture_v1_seq", folder / "v1")
    (folder / "aliases.json").write_text(json.dumps({"latest": 1}))
    trust(TrustRequest(ref="seq", yes=True), ToolContext(repo_root=tmp_path))
    m = capture_manifest(Repository(tmp_path).open("captures", "seq"))
    assert m.schema_version == 1 and m.export.weights == "embedded" and m.export.custom_ops == {}
    here = _error_of_running_it_here(FIXTURES / "capture_v1_seq")
    for strategy in ("source", "export"):
        rep = modulelens.replay_module("seq", strategy=strategy, backward=strategy == "source", repo=str(tmp_path))
        # bit for bit as the module itself computes on this machine: where this CPU rounds the
        # matrix product differently from the one that recorded the fixture, so does the replay
        assert rep.strategy == strategy and rep.max_abs_error == here, (strategy, rep.notes, here)
        assert rep.exact == (here == 0.0)
        assert strategy == "export" or rep.backward_match


def _error_of_running_it_here(folder) -> float:
    """The largest difference between the fixture's recorded output and the same module (built by
    hand from its manifest: Linear, GELU, Dropout, LayerNorm in training mode, with its weights and
    generator state) run in this process."""
    from safetensors.torch import load_file

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.2),
                                torch.nn.LayerNorm(16)).train()
    model.load_state_dict({k: v.clone() for k, v in load_file(str(folder / "weights.safetensors")).items()})
    x = load_file(str(folder / "inputs.safetensors"))["args.0"].clone()
    torch.random.set_rng_state(load_file(str(folder / "rng.safetensors"))["cpu"])
    want = load_file(str(folder / "outputs.safetensors"))["output"]
    return (model(x) - want).abs().max().item()
