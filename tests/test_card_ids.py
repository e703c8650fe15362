"""Card ids name a call site, not a rank: the same operator at the same call site of the example's
block has the same id in two repositories (each its own capture and timing), a card keeps its rank
as a separate field, a kernel written for another operator is refused as an operator mismatch
before anything is stored or built, and a module whose run time spread widely is flagged as noisy."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import modulelens
from modulelens.errors import ModuleLensError
from modulelens.registry import ToolContext
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tinyformer"
FIXTURE = Path(__file__).parent / "fixtures" / "opset_manifest_v1.json"


def _capture_example_block(repo: Path, seed: int):
    sys.path.insert(0, str(EXAMPLE))
    try:
        from model import TinyConfig, TinyFormer

        with modulelens.capture("blocks.1", name="blk", repo=repo, export=False):
            torch.manual_seed(seed)
            TinyFormer(TinyConfig(n_layers=2))(torch.randint(0, 256, (2, 16)))
    finally:
        sys.path.remove(str(EXAMPLE))
    return repo, capture_ops(CaptureOpsRequest(ref="blk", repeats=3, top=50), ToolContext(repo_root=repo))


@pytest.fixture(scope="module")
def two_captures(tmp_path_factory):
    """(repository, capture_ops reply) of blocks.1 of the example, captured in two repositories."""
    return [_capture_example_block(tmp_path_factory.mktemp(f"repo{i}"), seed=i) for i in (0, 1)]


def _cards(ops) -> list[tuple]:
    """(id's index, operator, phase, shapes, strides, arguments) of every card, by id."""
    return sorted((int(c.card_id.rpartition("/")[2]), c.op, c.phase, str(c.shapes), str(c.strides), str(c.args))
                  for c in ops.cards)


def test_card_ids_are_the_same_in_two_captures_of_the_example(two_captures):
    first, second = (_cards(ops) for _, ops in two_captures)
    assert len(first) >= 5 and first == second
    for _, ops in two_captures:
        assert [c.rank for c in ops.cards] == list(range(len(ops.cards)))  # listed by rank, the id apart
        assert ops.next[0].arguments["card"] == ops.cards[0].card_id  # the top card, by its id


def test_a_kernel_for_another_operator_is_named_an_operator_mismatch(two_captures):
    repo, ops = two_captures[0]
    layer_norm = next(c for c in ops.cards if "native_layer_norm" in c.op)
    softmax_kernel = "torch::Tensor forward(torch::Tensor x, int64_t dim, bool half_to_float) { return x; }\n"
    before = sorted((repo / "candidates").glob("*")) if (repo / "candidates").exists() else []
    req = ValidateKernelRequest(source_text=softmax_kernel, target=layer_norm.card_id, backend="cpp", time=False)
    with pytest.raises(ModuleLensError, match="operator mismatch") as err:
        validate_kernel(req, ToolContext(repo_root=repo))
    assert "aten.native_layer_norm.default" in str(err.value) and "takes 3" in str(err.value), str(err.value)
    after = sorted((repo / "candidates").glob("*")) if (repo / "candidates").exists() else []
    assert after == before  # refused before a candidate was stored


def test_a_noisy_module_time_is_flagged(cli, tmp_path):
    folder = tmp_path / "opsets" / "blk" / "v1"
    folder.mkdir(parents=True)
    stored = json.loads(FIXTURE.read_text())
    stored["module_time"].update(p20_s=0.001, p80_s=0.017)
    (folder / "manifest.json").write_text(json.dumps(stored))
    code, data, r = cli("list", "cards", "blk", "--repo", tmp_path, "--json")
    assert code == 0, r.output
    assert any("17x" in w and "p20" in w and "rank" in w for w in data["warnings"]), data["warnings"]
    shutil.rmtree(tmp_path / "opsets")
