"""The opset records (modulelens.ops.model): card ids, and opsets written by earlier versions.

``fixtures/opset_manifest_v1.json`` is the manifest ``capture-ops blk`` wrote for blocks.1 of the
example transformer before card ids were derived: every card stores ``"card_id": "?/N"``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from modulelens.errors import ModuleLensError, ReferenceNotFound
from modulelens.ops import open_card, open_opset
from modulelens.ops.model import (
    CardSample,
    OpCard,
    OpSetManifest,
    as_card,
    format_card_id,
    is_card_id,
    parse_card_id,
)
from modulelens.ops import describe_card, summarize_opset
from modulelens.repo import Repository

FIXTURE = Path(__file__).parent / "fixtures" / "opset_manifest_v1.json"


@pytest.fixture
def old_repo(tmp_path) -> Repository:
    """A repository holding the fixture as opset blk:v1 (its sample tensors are not needed here)."""
    folder = tmp_path / "opsets" / "blk" / "v1"
    folder.mkdir(parents=True)
    shutil.copy(FIXTURE, folder / "manifest.json")
    return Repository(tmp_path)


def test_card_ids_format_and_parse():
    assert format_card_id("blk:v2", 3) == "blk:v2/3"
    assert parse_card_id("blk:v2/3") == ("blk:v2", 3)
    assert parse_card_id(" blk@prod/0 ") == ("blk@prod", 0)
    assert parse_card_id(format_card_id("a.b:v1", 12)) == ("a.b:v1", 12)
    assert is_card_id("blk/0") and not is_card_id("blk") and not is_card_id("blk/x")
    for bad in ("blk", "/3", "blk/", "blk/-1", "blk/x"):
        with pytest.raises(ModuleLensError, match="invalid card id"):
            parse_card_id(bad)


def test_stored_json_still_holds_the_old_placeholder_ids():
    stored = json.loads(FIXTURE.read_text())
    assert stored["ref"] == "blk:v1" and {c["card_id"] for c in stored["cards"]} == {f"?/{i}" for i in range(30)}


def test_an_old_opset_loads_with_derived_ids():
    m = OpSetManifest.model_validate_json(FIXTURE.read_text())
    assert len(m.cards) == 30 and m.capture == "blk:v1" and m.module_time.repeats == 15
    assert [c.card_id for c in m.cards] == [f"blk:v1/{i}" for i in range(30)]
    assert all(c.index == i for i, c in enumerate(m.cards))
    assert m.cards_time_share == pytest.approx(sum(c.time_share for c in m.cards))
    shares = [c.time_share for c in m.cards]
    assert shares == sorted(shares, reverse=True)
    # Samples are typed; tensors are referenced by key, the RNG state only for random operators.
    bernoulli = m.cards[0]
    assert bernoulli.op == "aten.bernoulli_.float" and isinstance(bernoulli.samples[0], CardSample)
    assert bernoulli.samples[0].rng == "c0.s0.rng" and bernoulli.samples[0].args["$"] == "list"
    assert all(s.rng is None for c in m.cards if "bernoulli" not in c.op for s in c.samples)
    # A -inf argument survives reading (JSON -Infinity) and writing.
    full = next(c for c in m.cards if any(isinstance(a, float) and math.isinf(a) for a in c.args))
    assert json.loads(full.model_dump_json())["args"][0] == -math.inf


def test_written_cards_store_no_id_and_read_back_equal():
    m = OpSetManifest.model_validate_json(FIXTURE.read_text())
    stored = json.loads(m.model_dump_json())
    assert all("card_id" not in c for c in stored["cards"])
    again = OpSetManifest.model_validate(stored)
    assert again == m and [c.card_id for c in again.cards] == [c.card_id for c in m.cards]


def test_a_card_outside_an_opset_has_no_id():
    card = as_card({"op": "aten.relu.default", "card_id": "?/0"})
    assert card.index == 0 and card.samples == []
    with pytest.raises(ValueError, match="not read from a stored opset"):
        _ = card.card_id
    assert card.bind("x:v1").card_id == "x:v1/0"
    assert as_card(card) is card


def test_old_opset_through_the_repository(old_repo):
    art, m = open_opset(old_repo, "blk")
    assert art.ref == "blk:v1" and m.cards[5].card_id == "blk:v1/5"
    _, card = open_card(old_repo, "blk/7")
    assert card.card_id == "blk:v1/7" and card.index == 7
    with pytest.raises(ReferenceNotFound, match="has no card 30"):
        open_card(old_repo, "blk:v1/30")
    summary = summarize_opset(old_repo, "blk", kind="compute", top=2)
    assert [c.card_id for c in summary.cards] == [c.card_id for c in m.cards if c.kind == "compute"][:2]
    assert summary.cards_time_share == pytest.approx(m.cards_time_share)
    detail = describe_card(old_repo, "blk@latest/0")
    assert detail.card_id == "blk:v1/0" and detail.capture == "blk:v1" and detail.samples == m.cards[0].samples


def test_old_opset_through_the_cli(cli, old_repo):
    code, data, r = cli("list", "cards", "blk", "--limit", "3", "--repo", old_repo.root, "--json")
    assert code == 0, r.output
    assert [c["card_id"] for c in data["cards"]] == ["blk:v1/0", "blk:v1/1", "blk:v1/2"]
    code, data, r = cli("show", "card", "blk/2", "--repo", old_repo.root, "--json")
    assert code == 0 and data["card_id"] == "blk:v1/2" and data["opset"] == "blk:v1"


def test_card_defaults_for_cards_made_by_hand():
    card = OpCard(op="aten.gelu.default")
    assert (card.kind, card.phase, card.device, card.shapes, card.calls) == ("compute", "forward", "cpu", [], 0)
    assert card.model_fields_set == {"op"}


def _profile(shares: list[float], views: float = 0.0, kinds: list[str] | None = None) -> OpSetManifest:
    """A made-up opset: cards with these time shares of a 1 ms module run (p20 0.9 ms, p80 1.6 ms)."""
    kinds = kinds or ["memory"] * len(shares)
    cards = [OpCard(index=i, op="aten.add.Tensor", kind=k, time_share=s, time_s=s * 1e-3, calls=1)
             for i, (s, k) in enumerate(zip(shares, kinds, strict=True))]
    return OpSetManifest(capture="blk:v1", module_time={"median_s": 1e-3, "p20_s": 0.9e-3, "p80_s": 1.6e-3,
                                                        "repeats": 15}, views_time_share=views, cards=cards)


def test_shares_that_add_up_give_no_warning():
    from modulelens.ops.summary import time_share_warnings

    assert time_share_warnings(_profile([0.5, 0.3], views=0.1)) == []
    # listed view cards are counted once, not again through views_time_share
    assert time_share_warnings(_profile([0.5, 0.3, 0.1], views=0.1, kinds=["memory", "compute", "view"])) == []
    data = json.loads(FIXTURE.read_text())
    assert time_share_warnings(OpSetManifest.model_validate(data)) == []  # a real profile: 0.97


@pytest.mark.parametrize("shares, total", [([2.0, 1.19], "319%"), ([0.1, 0.06], "16%")])
def test_shares_far_from_one_are_a_warning(shares, total):
    """Issue 13: shares summed 0.16 to 3.19 across runs on a loaded machine, without a word."""
    from modulelens.ops.summary import time_share_warnings

    warnings = time_share_warnings(_profile(shares))
    assert len(warnings) == 1 and total in warnings[0] and "inconsistent" in warnings[0]
    assert "repeats" in warnings[0] and "0.9 ms to 1.6 ms" in warnings[0]


def test_opset_summary_carries_the_share_warning(tmp_path):
    repo = Repository(tmp_path)
    repo.create("opsets", "blk", lambda folder: _profile([2.0, 1.19]))
    summary = summarize_opset(repo, "blk")
    assert any("319%" in w for w in summary.warnings)  # a warning the agent reads first, not a note
