"""The candidate loop on the example transformer's real cards: template kernels for cpp (run and
validated here), triton (validated under the interpreter) and cuda (compile-checked with nvcc)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import TRAIN

pytestmark = pytest.mark.slow

FAMILIES = {"aten.gelu.default": "elementwise", "aten.native_layer_norm.default": "layer_norm",
            "aten._safe_softmax.default": "softmax"}


@pytest.fixture(scope="module")
def cards(tmp_path_factory, app):
    from click.testing import CliRunner

    repo = tmp_path_factory.mktemp("kernels-repo")
    r = CliRunner().invoke(app, ["capture-ops", str(TRAIN), "--module", "blocks.1", "--top", "100", "--repo", str(repo), "--json",
                                 "--", "--steps", "2"])
    assert r.exit_code == 0, r.output
    by_op = {c["op"]: c["card_id"] for c in json.loads(r.stdout)["cards"]}
    assert set(FAMILIES) <= set(by_op)
    return repo, {op: by_op[op] for op in FAMILIES}


def _generate(cli, repo, card, backend):
    code, gen, r = cli("generate-kernel", card, "--backend", backend, "--provider", "template", "--repo", repo, "--json")
    assert code == 0, r.output
    assert gen["provider"] == "template" and gen["family"]
    return gen


@pytest.mark.parametrize("op", list(FAMILIES))
def test_cpp_templates_validate_correct_and_are_timed(cli, cards, op):
    repo, by_op = cards
    gen = _generate(cli, repo, by_op[op], "cpp")
    assert gen["family"] == FAMILIES[op]
    code, rep, r = cli("validate-kernel", gen["candidate_id"], "--repo", repo, "--json")
    assert code == 0, r.output
    assert rep["verdict"] == "custom" and rep["correct"] is True, rep["reason"]
    _assert_timed(rep)
    assert not rep["flags"], rep["flags"]


def _assert_timed(rep: dict) -> None:
    """The timing interface, whatever the machine's load: a number only when determined, always
    an interval (or, where the rounds failed the noise checks, the range of round ratios in the reason,
    labelled so) and a reason, and a one-line note saying what, how, threads and why."""
    assert rep["timing_status"] in ("ok", "undetermined"), rep["timing_status"]
    if rep["timing_status"] == "ok":
        low, high = rep["speedup_interval"]
        assert low <= rep["speedup_vs_eager"] <= high
    else:
        assert rep["speedup_vs_eager"] is None
        assert rep["speedup_interval"] or "range of round ratios" in rep["timing_reason"], rep["timing_reason"]
    assert rep["timing_reason"] and rep["eager"]["runs"] > 0 and rep["candidate"]["runs"] > 0
    note = rep["timing_note"]
    assert "\n" not in note and "thread(s)" in note and rep["timing_reason"].split(" (")[0] in note and "rounds" in note, note
    assert rep["measurement"]["threads"] >= 1 and rep["measurement"]["rounds"] >= 1


@pytest.mark.parametrize("op", list(FAMILIES))
def test_triton_templates_validate_correct_under_the_interpreter(cli, cards, op):
    repo, by_op = cards
    gen = _generate(cli, repo, by_op[op], "triton")
    # one seed of fresh draws under the interpreter (seconds a call); every variant's numerics are
    # checked in-process by test_kernels_templates and the edge-case benchmark
    seeds = [] if torch.cuda.is_available() else ["--seeds", "1"]
    code, rep, r = cli("validate-kernel", gen["candidate_id"], *seeds, "--repo", repo, "--json")
    assert code == 0, r.output
    assert rep["correct"] is True and rep["verdict"] == "custom", rep["reason"]
    if not torch.cuda.is_available():
        assert rep["speedup_vs_eager"] is None and "TRITON_INTERPRET" in rep["timing_note"]
        # a few edge cases under the interpreter (seconds a call), the others named in the note and a warning
        (cut,) = [x for x in rep["left_out"] if x["field"] == "edge_cases"]
        assert cut["total"] == 3 and "edge cases not run: at most 3 under the Triton interpreter" in rep["edge_cases_note"]
        assert any("under the Triton interpreter" in w for w in rep["warnings"]), rep["warnings"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the cuda templates run; see test_gpu_templates")
@pytest.mark.parametrize("op", ["aten.gelu.default", "aten._safe_softmax.default"])
def test_cuda_templates_compile_with_nvcc(cli, cards, op):
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    repo, by_op = cards
    gen = _generate(cli, repo, by_op[op], "cuda")
    code, rep, r = cli("validate-kernel", gen["candidate_id"], "--repo", repo, "--json")
    assert code == 0, r.output
    assert rep["compiled"] is True and rep["ran"] is False, rep["reason"]
    assert "not run" in rep["reason"]


def test_profile_a_candidate_and_repair_lineage(cli, cards):
    repo, by_op = cards
    gen = _generate(cli, repo, by_op["aten.gelu.default"], "cpp")
    code, prof, r = cli("profile", gen["candidate_id"], "--min-run-time", "0.1", "--repo", repo, "--json")
    assert code == 0, r.output
    assert prof["target_kind"] == "candidate" and prof["p20_s"] <= prof["median_s"] <= prof["p80_s"]
    assert "contained process" in prof["timer"] and "fresh values" in prof["timer"]  # as validation times it
    code, rep, r = cli("validate-kernel", gen["candidate_id"], "--no-time", "--repo", repo, "--json")
    assert code == 0, r.output
    code, child, r = cli("generate-kernel", by_op["aten.gelu.default"], "--backend", "cpp", "--provider", "template",
                         "--parent", gen["candidate_id"], "--repo", repo, "--json")
    assert code == 0, r.output
    assert child["provenance"]["parent_verdict"] == rep["verdict"]  # the parent's latest report reached the provider
    assert child["params"].get("variant") != gen["params"].get("variant") or child["source_sha256"] != gen["source_sha256"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_gpu_templates(cli, cards, backend):
    repo, by_op = cards
    for op in FAMILIES:
        gen = _generate(cli, repo, by_op[op], backend)
        code, rep, r = cli("validate-kernel", gen["candidate_id"], "--device", "cuda", "--repo", repo, "--json")
        assert code == 0 and rep["correct"], r.output
