"""Capture from a 2-process torchrun job (gloo, CPU) running the unmodified DDP example."""

from __future__ import annotations

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
        assert code == 0 and rep["exact"]
    assert not (inputs[0] == inputs[1]).all()  # each rank saw its own data
