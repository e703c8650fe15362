"""The read-only tools the web UI shares with the CLI, on a small hand-written repository: a
capture's tensor statistics through show (kind capture), stored statistics runs filtered by name, and
their human views at 80 columns with every reference whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modulelens.repo import Repository


def _tensor(key: str, shape: list[int]) -> dict:
    return {"$": "tensor", "key": key, "shape": shape, "dtype": "float32", "stored": False,
            "stats": {"mean": 0.0, "std": 1.0, "min": -2.0, "max": 2.0, "zero_fraction": 0.0}}


def _write_capture(folder: Path) -> dict:
    return {
        "module_path": "enc.layer_with_a_long_name", "class_path": "models:Encoder", "strategies": [],
        "call_index": 1, "training": False,
        "inputs": {"args": {"$": "tuple", "items": [_tensor("args.0", [2, 3])]}, "kwargs": {"$": "dict", "items": []}},
        "outputs": _tensor("output", [2, 3]), "weights": {"lin.weight": _tensor("lin.weight", [3, 3])},
    }


def _write_stats(folder: Path) -> dict:
    (folder / "series.json").write_text(json.dumps({
        "steps": [0, 10], "order": ["lin"],
        "modules": {"lin": {"type": "Linear", "index": 0, "activation": {"std": [1.0, 2.0]}, "gradient": {}}},
        "types": {}, "definitions": {}}))
    (folder / "findings.json").write_text(json.dumps([{
        "kind": "dead_activation", "module": "lin", "step": 10, "severity": "error",
        "message": "lin is dead", "action": "check it", "evidence": {}}]))
    return {"source": {"kind": "script", "script": "train.py", "argv": []},
            "summary": {"kind": "run", "modules": 1, "steps_seen": 11, "steps_sampled": 2, "every": 10,
                        "order_source": "observed", "findings": 1, "report_files": []}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("read-views")
    r = Repository(root)
    r.create("captures", "encoder_layer_with_a_long_name", _write_capture)
    r.create("stats", "training_run_with_a_long_name", _write_stats)
    r.create("stats", "training_run_with_a_long_name", _write_stats)
    r.create("stats", "other", _write_stats)
    return root


def test_show_capture_gives_tensor_statistics_on_request(cli, repo):
    code, plain, out = cli("show", "capture", "encoder_layer_with_a_long_name", "--repo", repo, "--json")
    assert code == 0, out.output
    assert plain["tensors"] == [] and plain["ref"] == "encoder_layer_with_a_long_name:v1"
    code, full, out = cli("show", "capture", "encoder_layer_with_a_long_name", "--tensors", "--repo", repo, "--json")
    assert code == 0, out.output
    assert [(t["key"], t["group"], t["std"]) for t in full["tensors"]] == [
        ("args.0", "input", 1.0), ("output", "output", 1.0), ("lin.weight", "weight", 1.0)]
    assert full["tensor_notes"]


def test_list_stats_runs_by_name(cli, repo):
    code, every, out = cli("list", "stats", "--repo", repo, "--json")
    assert code == 0, out.output
    assert [r["run_id"] for r in every["runs"]] == ["other:v1", "training_run_with_a_long_name:v1",
                                                  "training_run_with_a_long_name:v2"]
    code, named, out = cli("list", "stats", "other", "--repo", repo, "--json")
    assert code == 0 and [r["run_id"] for r in named["runs"]] == ["other:v1"], out.output
    code, none, out = cli("list", "stats", "missing", "--repo", repo, "--json")
    assert code == 0 and none["runs"] == [], out.output


@pytest.mark.parametrize("args, ids", [
    (["show", "capture", "encoder_layer_with_a_long_name", "--tensors"],
     ["encoder_layer_with_a_long_name:v1", "lin.weight", "args.0"]),
    (["list", "stats"], ["training_run_with_a_long_name:v2", "other:v1", "train.py"]),
    (["show", "stats", "training_run_with_a_long_name"], ["training_run_with_a_long_name:v2", "dead_activation"]),
    (["list", "opsets"], []),
    (["list", "candidates"], []),
])
def test_read_views_keep_ids_whole_at_80_columns(app, repo, args, ids):
    from click.testing import CliRunner

    r = CliRunner().invoke(app, [*args, "--repo", str(repo)], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout
    for i in ids:
        assert i in r.stdout, (i, r.stdout)
