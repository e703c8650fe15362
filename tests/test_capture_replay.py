"""Capture from unmodified scripts and KernelBench files, replay, errors. Drives the CLI (click
runner) and the Python API; each capture runs the user's script in a worker process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES, TRAIN

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("repo")


@pytest.fixture(scope="module")
def block_ref(repo, app) -> str:
    from click.testing import CliRunner

    r = CliRunner().invoke(app, ["capture-module", str(TRAIN), "--module", "blocks.1", "--name", "blk",
                                 "--repo", str(repo), "--json", "--", "--steps", "3"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["ref"] == "blk:v1"
    assert data["module_path"] == "blocks.1"
    assert data["class_path"] == "model:Block"
    assert data["strategies"] == ["source", "export"]
    assert data["training"] is True
    return data["ref"]


@pytest.mark.parametrize("strategy", ["source", "export"])
def test_example_block_replays_exactly(cli, repo, block_ref, strategy):
    code, data, r = cli("replay-module", block_ref, "--strategy", strategy, "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["strategy"] == strategy
    assert data["match"] is True and data["exact"] is True
    assert data["max_abs_error"] == 0.0
    assert data["synthesized_inputs"] is False
    assert data["reconstruction_seconds"] > 0 and data["run_seconds"] > 0


def test_auto_uses_source_first_and_human_output(cli, repo, block_ref):
    code, _, r = cli("replay-module", block_ref, "--repo", repo)
    assert code == 0, r.output
    assert "exact match" in r.stdout and "(source)" in r.stdout


def test_list_and_show(cli, repo, block_ref):
    code, data, _ = cli("list", "captures", "--repo", repo, "--json")
    assert code == 0 and block_ref in [c["ref"] for c in data["captures"]]
    code, data, _ = cli("show", "capture", "blk@latest", "--full", "--repo", repo, "--json")
    assert code == 0 and data["ref"] == block_ref and "latest" in data["aliases"]
    init = data["manifest"]["init"]
    assert init["cls"] == "model:Block"
    cfg = init["kwargs"]["cfg"]
    assert cfg["$"] == "dataclass" and cfg["fields"]["activation"] == {"$": "enum", "cls": "model:Activation", "name": "GELU"}
    code, _, r = cli("show", "capture", block_ref, "--repo", repo)  # human output keeps bracket-free text intact
    assert code == 0 and "model:Block" in r.stdout


def test_repository_from_env(cli, repo, block_ref, monkeypatch):
    monkeypatch.setenv("MODULELENS_HOME", str(repo))
    code, data, _ = cli("show", "capture", block_ref, "--json")
    assert code == 0 and data["ref"] == block_ref


def test_dtype_override_is_close_not_exact(cli, repo, block_ref):
    code, data, r = cli("replay-module", block_ref, "--dtype", "float64", "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["match"] is True and data["max_abs_error"] < 1e-5


def test_export_repro_runs_standalone(cli, repo, block_ref, tmp_path):
    code, data, r = cli("export-repro", block_ref, "--out", tmp_path, "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["flavor"] == "source" and data["verified"] is True and data["max_abs_error"] == 0.0
    text = Path(data["path"]).read_text()
    assert "class Model(nn.Module)" in text and "def get_inputs" in text and "def get_init_inputs" in text
    import re

    assert not re.search(r"^(import model|from model import)", text, re.M)  # inlined, standalone
    code, data, r = cli("export-repro", block_ref, "--out", tmp_path, "--flavor", "export", "--repo", repo, "--json")
    assert code == 0 and data["verified"] is True, r.output


def test_class_defined_in_script_main(cli, repo):
    script = EXAMPLES / "scripts" / "main_defined.py"
    code, data, r = cli("capture-module", script, "--module", "0", "--name", "gated", "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["class_path"] == "__main__:GatedMLP" and "source" in data["strategies"]
    code, data, r = cli("replay-module", data["ref"], "--strategy", "source", "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["match"] and data["exact"]


def test_nested_config_dataclass_script(cli, repo):
    script = EXAMPLES / "scripts" / "nested_config.py"
    code, data, r = cli("capture-module", script, "--module", "type:Encoder", "--name", "enc", "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["unrecorded"] == [] and "source" in data["strategies"]
    code, data, r = cli("replay-module", data["ref"], "--strategy", "source", "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["match"] and data["max_abs_error"] == 0.0


def test_kernelbench_file_whole_model_and_shape_only(cli, repo):
    kb = EXAMPLES / "kernelbench" / "layernorm_gelu.py"
    code, data, r = cli("capture-module", kb, "--name", "kb", "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["module_path"] == "" and data["class_path"].endswith(":Model")
    code, rep, r = cli("replay-module", data["ref"], "--repo", repo, "--json")
    assert code == 0 and rep["match"] and rep["exact"], r.output
    # Above the threshold, the 16x128 float32 input (8 KiB) is stored shape-only.
    code, data, r = cli("capture-module", kb, "--name", "kb-big", "--max-tensor-bytes", "4096", "--repo", repo, "--json")
    assert code == 0, r.output
    assert "args.0" in data["shape_only"] and data["inputs"][0]["stored"] is False
    code, rep, r = cli("replay-module", data["ref"], "--repo", repo, "--json")
    assert code == 0, r.output
    assert rep["synthesized_inputs"] is True and rep["compared"] is False and rep["match"] is False
    assert any("synthesised" in n for n in rep["notes"])


def test_backward_capture_and_replay(cli, repo):
    code, data, r = cli("capture-module", TRAIN, "--module", "blocks.0.mlp", "--name", "mlp-bw", "--backward",
                        "--repo", repo, "--json", "--", "--steps", "2")
    assert code == 0, r.output
    assert data["backward"] is True
    code, rep, r = cli("replay-module", data["ref"], "--strategy", "source", "--backward", "--repo", repo, "--json")
    assert code == 0, r.output
    assert rep["match"] and rep["backward_match"] is True
    names = {b["name"] for b in rep["backward"]}
    assert "grad_input.0" in names and "param.fc1.weight" in names


def test_pickle_needs_trust(cli, repo):
    kb = EXAMPLES / "kernelbench" / "layernorm_gelu.py"
    code, data, r = cli("capture-module", kb, "--name", "kb-pkl", "--pickle", "--no-export", "--repo", repo, "--json")
    assert code == 0, r.output
    assert "pickle" in data["strategies"] and "export" not in data["strategies"]
    code, err, _ = cli("replay-module", data["ref"], "--strategy", "pickle", "--repo", repo, "--json")
    assert code == 2 and "--trust-pickle" in (err["hint"] or "")
    code, rep, r = cli("replay-module", data["ref"], "--strategy", "pickle", "--trust-pickle", "--repo", repo, "--json")
    assert code == 0 and rep["exact"], r.output


# -- bad input: clear errors, nothing lost or half-written -------------------------------------
def _versions(repo: Path) -> dict[str, list[str]]:
    return {p.name: sorted(q.name for q in p.iterdir() if q.is_dir()) for p in (repo / "captures").iterdir()}


def test_bad_inputs_give_clear_errors(cli, repo, block_ref):
    before = _versions(repo)
    code, err, _ = cli("replay-module", "nosuch", "--repo", repo, "--json")
    assert code == 2 and "no capture named 'nosuch'" in err["error"]
    code, err, _ = cli("capture-module", TRAIN, "--module", "blocks.1", "--name", "../x", "--repo", repo, "--json")
    assert code == 2 and "invalid name '../x'" in err["error"]
    code, err, _ = cli("capture-module", TRAIN, "--module", "blocks.9", "--repo", repo, "--json", "--", "--steps", "1")
    assert code == 2 and "no module matching 'blocks.9'" in err["error"] and "blocks.1" in err["hint"]
    code, err, _ = cli("capture-module", EXAMPLES / "scripts" / "raises.py", "--module", "x", "--repo", repo, "--json")
    assert code == 2 and "ValueError: bad batch in data loader" in err["error"] and "raises.py:" in err["error"]
    code, err, _ = cli("capture-module", "does/not/exist.py", "--repo", repo, "--json")
    assert code == 2 and "does not exist" in err["error"]
    assert _versions(repo) == before
    assert not any((repo / ".tmp").iterdir())


def test_tampered_tensor_file(cli, repo, tmp_path):
    import shutil

    kb = EXAMPLES / "kernelbench" / "layernorm_gelu.py"
    code, data, r = cli("capture-module", kb, "--name", "tamper", "--no-export", "--repo", repo, "--json")
    assert code == 0, r.output
    weights = Path(data["path"]) / "weights.safetensors"
    saved = tmp_path / "w"
    shutil.copyfile(weights, saved)
    raw = bytearray(weights.read_bytes())
    raw[-8:] = b"\x00" * 8
    weights.write_bytes(bytes(raw))
    code, err, _ = cli("replay-module", data["ref"], "--strategy", "source", "--repo", repo, "--json")
    assert code == 2 and "weights.safetensors" in err["error"] and "sha256" in err["error"]
    shutil.copyfile(saved, weights)  # the repository itself is intact once the file is restored
    code, rep, _ = cli("replay-module", data["ref"], "--strategy", "source", "--repo", repo, "--json")
    assert code == 0 and rep["exact"]


def test_four_concurrent_captures(repo):
    from concurrent.futures import ThreadPoolExecutor

    import modulelens

    kb = EXAMPLES / "kernelbench" / "layernorm_gelu.py"

    def one(_):
        return modulelens.capture_module(str(kb), name="conc", export=False, repo=str(repo))

    with ThreadPoolExecutor(4) as pool:
        refs = sorted(r.ref for r in pool.map(one, range(4)))
    assert refs == ["conc:v1", "conc:v2", "conc:v3", "conc:v4"]
    for ref in refs:
        rep = modulelens.replay_module(ref, repo=str(repo))
        assert rep.exact


# -- the in-process Python API ------------------------------------------------------------------
def test_context_manager_api(tmp_path):
    import sys

    import modulelens

    sys.path.insert(0, str(EXAMPLES / "tinyformer"))
    try:
        from model import TinyConfig, TinyFormer

        with modulelens.capture("blocks.2.attn", name="api-attn", repo=tmp_path) as cap:
            torch.manual_seed(0)
            model = TinyFormer(TinyConfig(n_layers=3))
            logits = model(torch.randint(0, 256, (2, 16)))
        assert logits.shape == (2, 16, 256)  # the run went on normally
        assert cap.artifact is not None and cap.artifact.ref == "api-attn:v1"
        rep = modulelens.replay_module("api-attn", strategy="source", repo=str(tmp_path))
        assert rep.exact
    finally:
        sys.path.remove(str(EXAMPLES / "tinyformer"))


class Cancelling(torch.nn.Module):
    """(1000 x + 1) - 1000 x: exactly 1 in float32, lost to rounding in bfloat16 (its spacing at
    1000 is 8); the output is cast back to float32, so its dtype does not show the bf16 compute."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((8,), 1000.0))

    def forward(self, x):
        y = self.scale * x
        return ((y + 1) - y).float()


def test_bf16_replay_uses_and_names_bf16_tolerances(tmp_path):
    import modulelens
    from modulelens.numerics import TOLERANCES

    with modulelens.capture("", name="cancel", repo=tmp_path, export=False):
        Cancelling()(torch.linspace(0.9, 1.1, 8))
    rep = modulelens.replay_module("cancel", dtype="bfloat16", repo=str(tmp_path))
    assert rep.outputs[0].dtype == "float32"
    assert (rep.rtol, rep.atol) == TOLERANCES[torch.bfloat16]  # not float32's, though the output is float32
    assert rep.tolerance_dtype == "bfloat16"
    assert rep.compared and not rep.match
    assert any("bfloat16 tolerances (rtol 0.016, atol 1e-05)" in n for n in rep.notes), rep.notes

    same = modulelens.replay_module("cancel", repo=str(tmp_path))  # no cast: float32 throughout, exact
    assert same.exact and same.tolerance_dtype == "float32"
    assert (same.rtol, same.atol) == TOLERANCES[torch.float32]
