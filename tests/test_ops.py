"""Operator cards and profiling, through the CLI."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, TRAIN

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return tmp_path_factory.mktemp("ops-repo")


@pytest.fixture(scope="module")
def block_cards(repo, app):
    """Cards of blocks.1 of the example transformer, captured from the unmodified script in one go."""
    import json

    from click.testing import CliRunner

    r = CliRunner().invoke(app, ["capture-ops", str(TRAIN), "--module", "blocks.1", "--top", "100", "--repo", str(repo), "--json",
                                 "--", "--steps", "2"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_block_cards_cover_the_block(block_cards):
    ops = {c["op"]: c for c in block_cards["cards"]}
    matmuls = [c for c in block_cards["cards"] if c["op"] in ("aten.addmm.default", "aten.mm.default", "aten.bmm.default")]
    assert len(matmuls) >= 5  # qkv, out proj, fc1, fc2, two attention bmms
    assert {"aten.native_layer_norm.default", "aten.gelu.default"} <= set(ops)
    assert any("softmax" in op or "scaled_dot_product" in op for op in ops)
    # The shapes the block really saw: batch 8, sequence 32, width 64, MLP hidden 256.
    assert ops["aten.native_layer_norm.default"]["shapes"][0] == [8, 32, 64]
    assert ops["aten.native_layer_norm.default"]["calls"] == 2
    assert ops["aten.gelu.default"]["shapes"] == [[8, 32, 256]]
    assert any(c["shapes"][1:] == [[256, 64], [64, 256]] for c in matmuls)  # fc1: x[256,64] @ W.T[64,256]
    shares = [c["time_share"] for c in block_cards["cards"]]
    assert shares == sorted(shares, reverse=True)
    # How much of the module's time the cards cover is a measurement (benchmarks/op_recording.py
    # reports it); on a loaded machine it swings, so the test only checks it was measured.
    assert block_cards["cards_time_share"] > 0 and block_cards["views_time_share"] >= 0
    assert all(c["kind"] != "view" for c in block_cards["cards"])


def test_every_card_replays_exactly(cli, repo, block_cards):
    for c in block_cards["cards"]:
        if not c["shapes"]:
            continue  # factories (ones, scalar_tensor) have no inputs; tested below
        code, data, r = cli("replay-module", c["card_id"], "--repo", repo, "--json")
        assert code == 0, r.output
        assert data["exact"] is True, (c["op"], data)


def test_list_and_show_cards(cli, repo, block_cards):
    name = block_cards["opset"].split(":")[0]
    code, data, _ = cli("list", "cards", name, "--op-kind", "compute", "--limit", "3", "--repo", repo, "--json")
    assert code == 0 and len(data["cards"]) == 3 and all(c["kind"] == "compute" for c in data["cards"])
    first = block_cards["cards"][0]["card_id"]
    code, data, _ = cli("show", "card", first, "--repo", repo, "--json")
    assert code == 0 and data["card_id"] == first and data["samples"]
    code, _, r = cli("show", "card", first, "--repo", repo)
    assert code == 0 and "of the module" in r.stdout


def test_profile_capture_reports_median_and_spread(cli, repo, block_cards):
    # Whether two profiles agree is a measurement for benchmarks/, not a timed assertion here.
    ref = block_cards["capture"]
    for _ in range(2):
        code, data, r = cli("profile", ref, "--no-breakdown", "--min-run-time", "0.3", "--repo", repo, "--json")
        assert code == 0, r.output
        for key in ("median_s", "p20_s", "p80_s", "runs", "timer", "device", "threads", "cache", "warmup"):
            assert key in data
        assert data["p20_s"] <= data["median_s"] <= data["p80_s"] and data["runs"] >= 10


def test_profile_memory_bound_card_roofline_and_breakdown(cli, repo, block_cards):
    gelu = next(c for c in block_cards["cards"] if c["op"] == "aten.gelu.default")
    code, data, r = cli("profile", gelu["card_id"], "--min-run-time", "0.2", "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["bytes_moved"] == 2 * 8 * 32 * 256 * 4  # read input + write output, float32
    assert 0 < data["roofline_fraction"] and data["copy_bytes_per_s"] > 0
    assert data["breakdown"][0]["op"] == "aten::gelu" and data["peak_memory_bytes"] >= 8 * 32 * 256 * 4
    code, _, r = cli("profile", gelu["card_id"], "--min-run-time", "0.1", "--repo", repo)
    assert code == 0 and "copy bandwidth" in r.stdout and "p20" in r.stdout and "warm-up" in r.stdout


def test_cards_from_kernelbench_file(cli, repo):
    kb = EXAMPLES / "kernelbench" / "layernorm_gelu.py"
    code, data, r = cli("capture-ops", kb, "--repo", repo, "--json")
    assert code == 0, r.output
    ops = {c["op"] for c in data["cards"]}
    assert {"aten.native_layer_norm.default", "aten.gelu.default", "aten.addmm.default"} <= ops


def test_backward_cards(cli, repo, block_cards):
    code, data, r = cli("capture-ops", block_cards["capture"], "--backward", "--top", "100", "--repo", repo, "--json")
    assert code == 0, r.output
    phases = {c["phase"] for c in data["cards"]}
    assert phases == {"forward", "backward"}
    assert any(c["op"] == "aten.native_layer_norm_backward.default" for c in data["cards"])


def test_bad_inputs(cli, repo, block_cards, tmp_path):
    import modulelens
    import torch

    opset = block_cards["opset"]
    code, err, _ = cli("show", "card", f"{opset}/999", "--repo", repo, "--json")
    assert code == 2 and "has no card 999" in err["error"]
    code, err, _ = cli("replay-module", "nosuch/0", "--repo", repo, "--json")
    assert code == 2 and "no opset named 'nosuch'" in err["error"]
    code, err, _ = cli("show", "card", opset, "--repo", repo, "--json")
    assert code == 2 and "invalid card id" in err["error"]
    factory = next(c for c in block_cards["cards"] if not c["shapes"])
    code, err, _ = cli("profile", factory["card_id"], "--repo", repo, "--json")
    assert code == 2 and "takes no tensor inputs" in err["error"]

    class NoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self):
            return self.w * 2

    with modulelens.capture("", name="noin", repo=tmp_path):
        NoInputs()()
    code, err, _ = cli("capture-ops", "noin", "--repo", tmp_path, "--json")
    assert code == 2 and "has no tensor inputs" in err["error"]
