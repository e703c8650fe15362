"""Capture from 2-process torchrun jobs (gloo, CPU): the unmodified DDP example, and an FSDP2 script."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import TRAIN

pytestmark = pytest.mark.slow


def test_torchrun_rank0_by_default_and_all_ranks(cli, tmp_path):
    code, data, r = cli("capture-module", TRAIN, "--module", "blocks.1", "--name", "dist", "--nproc", "2",
                        "--repo", tmp_path, "--json", "--", "--ddp", "--steps", "2")
    assert code == 0, r.output
    assert data["captures"] == ["dist:v1"] and (data["rank"], data["world_size"]) == (0, 2)
    # DDP wraps the model as `module.`: the module path is the unwrapped name.
    assert data["module_path"] == "blocks.1"

    code, data, r = cli("capture-module", TRAIN, "--module", "blocks.1", "--name", "dist", "--nproc", "2",
                        "--ranks", "all", "--repo", tmp_path, "--json", "--", "--ddp", "--steps", "2")
    assert code == 0, r.output
    assert data["captures"] == ["dist-rank0:v1", "dist-rank1:v1"]
    inputs = []
    for rank, ref in enumerate(data["captures"]):
        code, show, _ = cli("show", "capture", ref, "--full", "--repo", tmp_path, "--json")
        assert show["manifest"]["distributed"]["rank"] == rank
        assert show["manifest"]["distributed"]["world_size"] == 2
        inputs.append(load_file(f"{show['path']}/inputs.safetensors")["args.0"])
        code, rep, _ = cli("replay-module", ref, "--repo", tmp_path, "--json")
        assert code == 0 and rep["exact"], (rep.get("max_abs_error"), rep.get("notes"))
    assert not (inputs[0] == inputs[1]).all()  # each rank saw its own data


FSDP2_TRAIN = str(Path(__file__).parent / "scripts" / "fsdp2_train.py")


def test_fsdp2_block_is_captured_whole_and_replays_by_source_and_export(cli, tmp_path):
    """blocks.1 is an FSDP2 unit: outside its forward its parameters are DTensor shards. The capture
    reads them whole inside the call and exports on them, on rank 0 alone."""
    code, data, r = cli("capture-module", FSDP2_TRAIN, "--module", "blocks.1", "--name", "fsdp", "--nproc", "2",
                        "--repo", tmp_path, "--json", "--", "--steps", "2")
    assert code == 0, r.output
    assert (data["rank"], data["world_size"]) == (0, 2) and data["strategies"] == ["source", "export"], data["notes"]
    weights = load_file(f"{data['path']}/weights.safetensors")
    assert weights["up.weight"].shape == (32, 16)  # the whole parameter, not rank 0's shard
    for strategy in ("source", "export"):
        code, rep, r = cli("replay-module", "fsdp", "--strategy", strategy, "--repo", tmp_path, "--json")
        assert code == 0 and rep["exact"] and rep["max_abs_error"] == 0.0, r.output
