"""Packs on code nobody here wrote: a tiny random-initialised transformers GPT-2, trained by a script
whose sequence length changes from step to step (examples/transformers_tiny/train.py).

One block is captured at sequence length 16 with gradients; its layer_norm card (forward) and its
softmax backward card get C++ template kernels, validated with their shape rules (sizes not
captured checked too), packed into the repository, and used when the same script trains at lengths
24 and 12: hits in forward and in ``loss.backward()``, the same losses. Then the guards (dtype,
device, strides, modes, a size outside the rule), check_pack, list_packs over MCP and the UI's page.
One capture and one pack are shared by the module (capture, two C++ builds and two validations:
about a minute cold).
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import EXAMPLES

pytestmark = pytest.mark.slow

TRAIN = EXAMPLES / "transformers_tiny" / "train.py"
LAYER_NORM = "aten.native_layer_norm.default"
SOFTMAX_BACKWARD = "aten._softmax_backward_data.default"


@pytest.fixture(scope="module")
def gpt2_pack(tmp_path_factory, app):
    """(repo, pack ref, pack file, [layer_norm candidate, softmax backward candidate], validation
    reports, the run at other lengths)."""
    from click.testing import CliRunner

    runner = CliRunner()
    repo = tmp_path_factory.mktemp("gpt2-repo")

    def cli(*args):
        r = runner.invoke(app, [str(args[0]), "--repo", str(repo), "--json", *map(str, args[1:])])
        assert r.exit_code == 0, r.output[-3000:]
        return json.loads(r.stdout)

    ops = cli("capture-ops", TRAIN, "--module", "transformer.h.0", "--backward", "--top", "100",
              "--", "--steps", "1", "--lengths", "16")
    cards = {(c["op"], c["phase"]): c["card_id"] for c in ops["cards"]}
    candidates, reports = [], []
    for key in ((LAYER_NORM, "forward"), (SOFTMAX_BACKWARD, "backward")):
        gen = cli("generate-kernel", cards[key], "--backend", "cpp", "--provider", "template")
        rep = cli("validate-kernel", gen["candidate_id"])
        assert rep["verdict"] == "custom" and rep["correct"], rep["reason"]
        candidates.append(gen["candidate_id"])
        reports.append(rep)
    # --force: the entries are used whatever this (shared, noisy) machine measured
    packed = cli("pack", *candidates, "--force", "--out", repo / "gpt2.pack")
    # --compare switches the pack off in alternate steps (ToggleSchedule: on in steps 0 and 2), so each
    # length runs twice: once with the pack, once without
    run = cli("run", TRAIN, "--pack", packed["ref"], "--compare", "--", "--steps", "4", "--lengths", "24,24,12,12")
    return repo, packed["ref"], repo / "gpt2.pack", candidates, reports, run


def test_validation_checks_and_records_the_shape_rule(gpt2_pack):
    _, _, _, _, (ln, sb), _ = gpt2_pack
    rule = ln["shape_rule"]
    assert rule["checked"] and [d["at"] for d in rule["dims"]] == [[[0, 0]], [[0, 1]]]  # batch and length vary
    seq = rule["dims"][1]
    assert seq["captured"] == 16 and seq["sizes"] == [1, 9, 16, 33]
    # softmax backward: grad_output and output share every size
    assert [d["at"] for d in sb["shape_rule"]["dims"]][-1] == [[0, 3], [1, 3]]


def test_the_pack_serves_two_other_lengths_forward_and_backward_with_the_same_losses(gpt2_pack):
    _, ref, _, (ln, sb), _, run = gpt2_pack
    assert run["exit_code"] == 0 and run["outputs_match"] is True, (run["outputs_with"], run["outputs_without"])
    assert len(run["outputs_with"]) == 4 and run["max_output_difference"] <= 1e-5
    from modulelens.dispatch.script import ToggleSchedule

    by_id = {e["candidate_id"]: e for e in run["entries"]}
    assert [i for i in range(4) if ToggleSchedule.on(i)] == [0, 2]  # the pack ran at lengths 24 and 12
    # 2 blocks x (ln_1, ln_2) + ln_f per step with the pack, at lengths 24 and 12 (captured at 16)
    assert by_id[ln]["hits_by_phase"] == {"forward": 10} and by_id[ln]["fallbacks"] == 0, by_id[ln]
    # the attention softmax's backward in each block, inside loss.backward()
    assert by_id[sb]["hits_by_phase"] == {"backward": 4} and by_id[sb]["fallbacks"] == 0, by_id[sb]
    assert run["summary"].startswith("14 hits") and not any("0 hits" in w or "fell back" in w for w in run["warnings"])
    assert run["recorded"] == f"{ref.split(':')[0]}.v1:v1"


def test_pack_stores_a_version_in_the_repository(gpt2_pack):
    from modulelens.repo import Repository
    from modulelens.team.packs import PackManifest

    repo, ref, path, candidates, _, _ = gpt2_pack
    art = Repository(repo).open("packs", ref)
    manifest = art.manifest_as(PackManifest)
    assert ref == "gpt2:v1" and manifest.candidates == candidates
    assert (art.path / "pack.json").read_bytes() == path.read_bytes()
    assert manifest.sha256 == json.loads(path.read_text())["sha256"]
    assert [e.phase for e in manifest.entries] == ["forward", "backward"]
    assert "admits 1..33" in manifest.entries[0].shape_rule


class _Norm(torch.nn.Module):
    """Calls the layer norm operator the way GPT-2's blocks do."""

    def __init__(self, c: int = 32, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.c = c
        self.weight = torch.nn.Parameter(torch.ones(c, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(c, dtype=dtype))

    def forward(self, x):
        return torch.ops.aten.native_layer_norm(x, [self.c], self.weight, self.bias, 1e-5)[0]


def _run_norm(path, x, norm=None):
    """One call of a _Norm on ``x`` with the pack applied; (output, eager output, entry report)."""
    import modulelens

    norm = norm if norm is not None else _Norm().train()
    want = norm(x)
    applied = modulelens.apply_pack(norm, path)
    try:
        got = norm(x)
    finally:
        applied.remove()
    return got, want, applied.report().entries[0]


# A size inside the rule is served; each of these falls back, counted with its reason.
GUARDS = {
    "another dtype": (lambda: torch.randn(2, 24, 32, dtype=torch.float64), lambda: _Norm(dtype=torch.float64),
                      "dtype float64"),
    "another device": (lambda: torch.randn(2, 24, 32, device="meta"), lambda: _Norm().to("meta"), "device meta"),
    "another stride": (lambda: torch.randn(24, 2, 32).transpose(0, 1), _Norm, "not contiguous"),
    "a size outside the rule": (lambda: torch.randn(2, 48, 32), _Norm, "outside the shape rule (checked 1..33)"),
    "a dimension the rule fixes": (lambda: torch.randn(2, 24, 16), lambda: _Norm(16), "(validated: 32; not variable)"),
    "eval mode": (lambda: torch.randn(2, 24, 32), lambda: _Norm().eval(), "training=False (validated: training=True)"),
}


@pytest.mark.parametrize("case", list(GUARDS))
def test_calls_outside_the_validated_pattern_fall_back_with_their_reason(gpt2_pack, case):
    _, _, path, _, _, _ = gpt2_pack
    make_x, make_norm, reason = GUARDS[case]
    got, want, entry = _run_norm(path, make_x(), make_norm())
    assert entry.hits == 0 and entry.fallbacks == 1, entry
    assert reason in next(iter(entry.fallback_reasons)), entry.fallback_reasons
    if got.device.type != "meta":
        assert torch.equal(got, want)


@pytest.mark.parametrize("mode, reason", [(torch.no_grad, "grad mode off (validated: grad mode on)"),
                                          (torch.inference_mode, "inference mode (validated: grad mode on)")])
def test_grad_and_inference_mode_calls_are_counted_misses(gpt2_pack, mode, reason):
    _, _, path, _, _, _ = gpt2_pack
    with mode():
        got, want, entry = _run_norm(path, torch.randn(2, 24, 32))
    assert entry.hits == 0 and entry.fallbacks == 1 and reason in next(iter(entry.fallback_reasons))
    assert torch.equal(got, want)


def test_a_size_inside_the_rule_is_served(gpt2_pack):
    _, _, path, _, _, _ = gpt2_pack
    got, want, entry = _run_norm(path, torch.randn(3, 7, 32))
    assert entry.hits == 1 and entry.fallbacks == 0
    assert torch.allclose(got, want, atol=1e-5)


def test_check_pack_replays_forward_and_backward_and_lists_with_the_hits(gpt2_pack, cli):
    repo, ref, _, candidates, _, _ = gpt2_pack
    code, r, res = cli("check-pack", ref, "--min-run-time", "0.05", "--repo", repo, "--json")
    assert code == 0, res.output
    assert r["ok"] is True and not r["not_hit"] and not r["untested"], r
    check = r["checks"][0]
    assert check["backward"] and check["grads_match"] and check["matches_captured"], check["detail"]
    assert {e["candidate_id"]: e["hits"] for e in check["entries"]} == {candidates[0]: 2, candidates[1]: 1}
    code, shown, res = cli("show", "pack", ref, "--repo", repo, "--json")
    assert code == 0, res.output
    assert shown["last_check"]["ok"] is True and shown["trusted"] and shown["last_run"]["hits"] == 14
    entries = {e["candidate_id"]: e for e in shown["entries"]}
    assert entries[candidates[0]]["run_hits"] == {"forward": 10} and entries[candidates[0]]["check_hits"] == 2
    assert entries[candidates[1]]["run_hits"] == {"backward": 4} and entries[candidates[1]]["check_hits"] == 1


def test_check_pack_with_zero_hits_is_not_ok_and_claims_no_speedup(gpt2_pack, cli, tmp_path):
    import modulelens
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    repo, ref, _, _, _, _ = gpt2_pack
    torch.manual_seed(0)
    with torch.no_grad(), modulelens.capture("", name="blk-nograd", repo=repo, export=False):
        block = GPT2Block(GPT2Config(n_embd=32, n_head=2, n_positions=64, attn_pdrop=0.0, resid_pdrop=0.0)).eval()
        block(torch.randn(2, 16, 32))
    code, r, res = cli("check-pack", ref, "blk-nograd", "--min-run-time", "0.05", "--repo", repo, "--json")
    assert code == 0, res.output
    assert r["ok"] is False and r["hits"] == 0 and r["summary"].startswith("0 hits")
    assert all(c["speedup"] is None for c in r["checks"]) and r["checks"][0]["matches_captured"]


def test_list_packs_over_mcp(gpt2_pack):
    """``list`` of kind packs (list_packs) through a real MCP client."""
    import anyio
    import mcp

    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    repo, ref, _, candidates, _, _ = gpt2_pack

    async def main():
        async with mcp.Client(build_server(all_tools(), repo_root=repo)) as c:
            return await c.call_tool("list", {"kind": "packs"})

    result = anyio.run(main)
    assert not result.is_error
    packs = result.structured_content["packs"]
    assert [p["ref"] for p in packs] == [ref]
    assert (packs[0]["entries"], packs[0]["shape_rules"], packs[0]["backward"]) == (2, 2, 1)
    assert packs[0]["last_run"]["hits"] == 14 and packs[0]["last_run"]["summary"].startswith("14 hits")


def test_the_ui_lists_the_pack_with_entries_rules_and_hits(gpt2_pack):
    from starlette.testclient import TestClient

    from modulelens.ui.app import build_app
    from modulelens.ui.state import UiSettings

    repo, ref, _, candidates, _, _ = gpt2_pack
    with TestClient(build_app(UiSettings(repo_root=repo, project_root=repo)), base_url="http://127.0.0.1:8765") as c:
        r = c.get("/packs")
    assert r.status_code == 200 and "None yet." not in r.text
    assert ref in r.text and all(cid in r.text for cid in candidates)
    assert "admits 1..33" in r.text and "forward 10" in r.text and "backward 4" in r.text
