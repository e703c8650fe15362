"""The typed candidate catalog: card and module candidates side by side in ``list candidates``
(MCP, CLI), ``show candidate`` and the UI's Candidates and opset pages, each row saying its kind;
a stored candidate whose files cannot be read is listed as broken, not fatal to the list.

One repository for the module: a captured TanhScale, its operator cards, a template kernel for
one card (never validated), a ModelNew validated correct, a ModelNew that raises in ``__init__``
and a candidate folder whose manifest is damaged by hand."""

from __future__ import annotations

import json
import textwrap

import anyio
import pytest
from mcp import Client
from starlette.testclient import TestClient

from conftest import capture_tanh_scale, validate_source

from modulelens.mcp_server.server import build_server
from modulelens.registry import ToolContext
from modulelens.tools import all_tools
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.generate_kernel import GenerateKernelRequest, generate_kernel

pytestmark = pytest.mark.slow

GOOD = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class ModelNew(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return torch.tanh(x) * self.weight
""")
RAISES = textwrap.dedent("""
    import torch.nn as nn

    class ModelNew(nn.Module):
        def __init__(self, dim):
            raise RuntimeError("no ModelNew today")
""")


@pytest.fixture(scope="module")
def mixed_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("mixed-candidates")
    capture_tanh_scale(repo)
    ctx = ToolContext(repo_root=repo)
    ops = capture_ops(CaptureOpsRequest(ref="scale", repeats=3), ctx)
    card = ops.cards[0].card_id
    kernel = generate_kernel(GenerateKernelRequest(card=card), ctx).candidate_id
    good = validate_source(repo, GOOD)
    raises = validate_source(repo, RAISES)
    broken = repo / "candidates" / "damaged" / "v1"
    broken.mkdir(parents=True)
    (broken / "manifest.json").write_text(json.dumps({"kind": "candidates", "name": "damaged", "version": 1}))
    return repo, card, kernel, good, raises


def _mcp(repo, *calls):
    async def main():
        async with Client(build_server(all_tools(), repo_root=repo)) as c:
            return [await c.call_tool(name, args) for name, args in calls]

    return anyio.run(main)


def test_list_and_show_over_mcp_give_each_candidate_by_its_kind(mixed_repo):
    repo, card, kernel, good, raises = mixed_repo
    assert good.verdict in ("custom", "wrapper") and good.correct, good.reason
    assert raises.verdict == "rejected"
    every, of_card, of_capture, shown, shown_broken = _mcp(
        repo, ("list", {"kind": "candidates"}), ("list", {"kind": "candidates", "of": card}),
        ("list", {"kind": "candidates", "of": "scale"}), ("show", {"kind": "candidate", "ref": good.candidate_id}),
        ("show", {"kind": "candidate", "ref": "damaged:v1"}))
    assert not every.is_error, every.content[0].text
    rows = {r["candidate_id"]: r for r in every.structured_content["candidates"]}
    assert rows[kernel]["kind"] == "card" and rows[kernel]["target"] == rows[kernel]["card_id"]
    assert rows[kernel]["verdict"] is None
    assert rows[good.candidate_id]["kind"] == "module" and rows[good.candidate_id]["target"] == "scale:v1"
    assert rows[good.candidate_id]["verdict"] == good.verdict and rows[good.candidate_id]["card_id"] is None
    assert rows[raises.candidate_id]["kind"] == "module" and rows[raises.candidate_id]["verdict"] == "rejected"
    assert rows["damaged:v1"]["kind"] == "broken" and "target" in rows["damaged:v1"]["problem"]
    assert [r["candidate_id"] for r in of_card.structured_content["candidates"]] == [kernel]
    assert {r["candidate_id"] for r in of_capture.structured_content["candidates"]} == {good.candidate_id,
                                                                                         raises.candidate_id}
    view = shown.structured_content
    assert not shown.is_error and view["entry"]["kind"] == "module" and "class ModelNew" in view["source"]
    assert view["entry_point"] == "ModelNew" and view["report"]["verdict"] == good.verdict
    assert shown_broken.is_error and "damaged:v1" in shown_broken.content[0].text


def test_the_cli_lists_a_module_candidate_beside_a_card_candidate(mixed_repo, cli):
    repo, _, kernel, good, _ = mixed_repo
    code, data, out = cli("list", "candidates", "--repo", repo, "--json")
    assert code == 0, out.output
    assert {c["candidate_id"]: c["kind"] for c in data["candidates"]}[good.candidate_id] == "module"
    code, _, out = cli("list", "candidates", "--repo", repo)
    assert code == 0 and kernel in out.output and "broken" in out.output, out.output
    code, _, out = cli("show", "candidate", good.candidate_id, "--repo", repo)
    assert code == 0 and "scale:v1" in out.output, out.output


def test_the_ui_pages_show_module_and_broken_candidates(mixed_repo):
    from modulelens.ui.app import build_app
    from modulelens.ui.state import UiSettings

    repo, card, kernel, good, _ = mixed_repo
    opset = card.rpartition("/")[0]
    with TestClient(build_app(UiSettings(repo_root=repo, project_root=repo)), base_url="http://127.0.0.1:8765") as c:
        listing = c.get("/candidates")
        page = c.get(f"/candidates/{good.candidate_id}")
        cards = c.get(f"/cards/{opset}")
    assert listing.status_code == 200, listing.text
    assert good.candidate_id in listing.text and kernel in listing.text and "damaged:v1" in listing.text
    assert page.status_code == 200 and "module candidate" in page.text and "ModelNew" in page.text
    assert cards.status_code == 200 and kernel in cards.text


def test_a_cancelled_revalidation_leaves_the_last_complete_verdict(mixed_repo):
    """A validation cancelled midway stores an ``interrupted`` report; the candidate's verdict in
    the listing, in show and for packing stays that of the last complete validation."""
    from modulelens.repo import Repository
    from modulelens.validation import latest_report, save_report
    from modulelens.validation.report import ModuleValidationSettings
    from modulelens.validation.sandboxed import interrupted_report

    repo, _, _, good, _ = mixed_repo
    store = Repository(repo)
    art = store.open("candidates", good.candidate_id)
    before = latest_report(store, art)
    save_report(store, art, interrupted_report("timing", "cpp"), ModuleValidationSettings(capture="scale:v1"))
    after = latest_report(store, art)
    assert after is not None and after.verdict == before.verdict and "interrupted" not in after.flags
    listed, shown = _mcp(repo, ("list", {"kind": "candidates"}),
                         ("show", {"kind": "candidate", "ref": good.candidate_id}))
    row = {c["candidate_id"]: c for c in listed.structured_content["candidates"]}[good.candidate_id]
    assert row["verdict"] == before.verdict and row["reports"] == 2
    assert shown.structured_content["report"]["verdict"] == before.verdict
