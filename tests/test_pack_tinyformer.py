"""The whole loop on the example transformer: C++ template kernels (softmax, layer norm) and a
module-level candidate for one block (examples/tinyformer/fused_block.py), validated, packed, and
applied to the unmodified training script: hits, the same losses, check-pack on the capture.

Nothing here depends on the machine being quiet: the pack decides from the intervals the
validations got (checked against the decision rule), and the runs use a pack made with force."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import EXAMPLES, TRAIN

pytestmark = pytest.mark.slow

FUSED_BLOCK = EXAMPLES / "tinyformer" / "fused_block.py"
OPS = ("aten._safe_softmax.default", "aten.native_layer_norm.default")


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory, app):
    """One capture of blocks.1 (with gradients), its cards, two validated C++ template kernels, the
    validated fused block, and the pack of all three. Shared by the module (C++ builds are slow)."""
    import json

    from click.testing import CliRunner

    runner = CliRunner()
    repo = tmp_path_factory.mktemp("pack-repo")

    def cli(*args):
        r = runner.invoke(app, [str(args[0]), "--repo", str(repo), "--json", *map(str, args[1:])])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    ops = cli("capture-ops", TRAIN, "--module", "blocks.1", "--backward", "--top", "100", "--", "--steps", "2")
    cards = {c["op"]: c["card_id"] for c in ops["cards"] if c["phase"] == "forward"}
    candidates = []
    for op in OPS:
        gen = cli("generate-kernel", cards[op], "--backend", "cpp", "--provider", "template")
        rep = cli("validate-kernel", gen["candidate_id"])
        assert rep["verdict"] == "custom" and rep["correct"], rep["reason"]
        candidates.append(gen["candidate_id"])
    module = cli("validate-kernel", "--source", FUSED_BLOCK, "--target", ops["capture"], "--claims-training",
                 "--limit", "100")
    assert module["correct"] and module["verdict"] == "wrapper", module["reason"]
    assert "same RNG state" in module["reason"]
    assert any("against the captured gradients" in c["name"] for c in module["checks"])
    layers = {x["name"]: x["in_force"] for x in module["isolation"]["layers"]}  # its own candidate process
    assert layers["process separation"] and "signing key and repository unreadable" in layers, layers
    assert "contained candidate process" in module["reason"], module["reason"]
    assert module["timing_status"] in ("ok", "undetermined") and module["timing_reason"]  # the JSON interface
    assert (module["speedup_vs_eager"] is None) == (module["timing_status"] == "undetermined")
    assert len(module["speedup_interval"]) == 2 and "training mode with grad" in module["timing_note"]
    candidates.append(module["candidate_id"])
    packed = cli("pack", *candidates, "--out", repo / "decided.pack")
    path = repo / "tiny.pack"
    forced = cli("pack", *candidates, "--out", path, "--force")
    return repo, path, (packed, forced), candidates


def test_pack_lists_its_entries_and_uses_only_surely_faster_ones_unless_forced(tiny_pack):
    _, path, (packed, forced), candidates = tiny_pack
    assert forced["path"] == str(path) and len(forced["sha256"]) == 64
    assert [e["candidate_id"] for e in packed["entries"]] == candidates
    targets = [e["target"] for e in packed["entries"]]
    assert targets[:2] == list(OPS) and targets[2].endswith("Block at blocks.1")
    assert packed["environment"]["torch"] == torch.__version__
    for e in packed["entries"]:  # the rule, applied to whatever interval the validation got
        interval = e["speedup_interval"]
        assert e["dispatched"] == bool(interval and interval[0] > 1), e
        assert not e["forced"] and (e["dispatched"] or "interval" in e["skip_reason"])
        if e["speedup_vs_eager"] is not None:
            assert interval[0] <= e["speedup_vs_eager"] <= interval[1]
    assert all(e["dispatched"] and e["forced"] and e["skip_reason"] is None for e in forced["entries"])


def test_run_the_training_script_with_the_pack(tiny_pack, cli):
    from modulelens.dispatch.script import ToggleSchedule

    _, path, (_, forced), candidates = tiny_pack
    steps = 14  # 2 warm-up steps, then 6 pairs with and without the pack: enough for an interval
    code, r, res = cli("run", TRAIN, "--pack", path, "--compare", "--limit", "20", "--json", "--", "--steps",
                       str(steps))
    assert code == 0, res.output
    assert r["exit_code"] == 0 and r["hits"] > 0
    assert r["outputs_match"] is True and len(r["outputs_with"]) == steps, (r["outputs_with"], r["outputs_without"])
    assert r["step_seconds_with"] > 0 and r["step_seconds_without"] > 0
    assert r["timing_status"] in ("ok", "undetermined") and r["timing_reason"]
    assert (r["step_ratio"] is None) == (r["timing_status"] == "undetermined")
    # A 95% interval goes with every ratio; an undetermined one whose rounds failed the noise checks
    # (a loaded machine) has none, and its reason gives the range of round ratios instead.
    interval = r["step_ratio_interval"]
    if r["step_ratio"] is not None:
        low, high = interval
        assert low <= r["step_ratio"] <= high
    else:
        assert interval is not None or "range of round ratios" in r["timing_reason"], r["timing_reason"]
    low, high = interval or (float("nan"), float("nan"))
    by_id = {e["candidate_id"]: e for e in r["entries"]}
    for e in forced["entries"]:
        got = by_id[e["candidate_id"]]
        assert got["dispatched"] and got["fallbacks"] == 0, got
    on = sum(ToggleSchedule.on(i) for i in range(steps))  # the pack was on in these steps only
    assert by_id[candidates[2]]["hits"] == on  # the fused block, once per step with the pack
    assert sum(by_id[c]["hits"] for c in candidates[:2]) > 0
    print(f"\ntinyformer step time with the pack / without: {r['step_seconds_with'] * 1e3:.2f} ms / "
          f"{r['step_seconds_without'] * 1e3:.2f} ms (ratio {r['step_ratio']}, 95% {low:.3f}..{high:.3f}, "
          f"{r['timing_status']})", file=sys.stderr)


def test_check_pack_replays_the_capture(tiny_pack, cli):
    repo, path, _, candidates = tiny_pack
    code, r, res = cli("check-pack", path, "--repo", repo, "--json")
    assert code == 0, res.output
    assert r["ok"] is True and len(r["checks"]) == 1
    check = r["checks"][0]
    assert check["matches_captured"] and check["matches_eager"], check["detail"]
    assert check["hits"] > 0 and check["eager_median_s"] > 0 and check["pack_median_s"] > 0
    assert check["timing_status"] in ("ok", "undetermined") and check["speedup_interval"]
    assert (check["speedup"] is None) == (check["timing_status"] == "undetermined")
    hits = {e["candidate_id"]: e["hits"] for e in check["entries"]}
    assert hits == {candidates[2]: 1}  # the replayed block is the module entry's blocks.1: it runs instead of the ops
    assert [u.split(":")[0] for u in r["untested"]] == [c.split(":")[0] for c in candidates[:2]]
    assert all("inside blocks.1.module:v1" in u for u in r["untested"]) and check["grads_match"] is True


def test_apply_pack_to_the_model_in_python(tiny_pack):
    import modulelens

    _, path, _, candidates = tiny_pack
    sys.path.insert(0, str(EXAMPLES / "tinyformer"))
    try:
        from model import TinyConfig, TinyFormer
    finally:
        sys.path.remove(str(EXAMPLES / "tinyformer"))
    torch.manual_seed(0)
    model = TinyFormer(TinyConfig()).train()  # training: attention takes the math path (softmax card)
    idx = torch.randint(0, 256, (8, 32))
    torch.manual_seed(1)
    want = model(idx)
    applied = modulelens.apply_pack(model, path)
    try:
        torch.manual_seed(1)  # the same dropout masks
        out = model(idx)
        out.sum().backward()
        with torch.no_grad():
            model(idx)  # grad off: no entry matches
    finally:
        applied.remove()
    assert torch.allclose(out, want, atol=1e-5)
    by_id = {e.candidate_id: e for e in applied.report().entries}
    assert by_id[candidates[0]].hits == 3  # softmax in blocks 0, 2, 3; the fused block 1 has its own
    assert by_id[candidates[0]].fallbacks == 4 and "grad mode off" in next(iter(by_id[candidates[0]].fallback_reasons))
    module = by_id[candidates[2]]
    assert module.hits == 1 and module.fallbacks == 1 and "grad mode off" in next(iter(module.fallback_reasons))
