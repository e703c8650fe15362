"""optimize: the tree's selection rules (pure), then searches over a real card: template provider
through the CLI, resume after SIGKILL, agent children, the ray executor on a local Ray instance
(skipped when ray is not installed), and LLM providers driven by fakes (repair, cost, money budget).

C++ builds are slow on a loaded machine: every search here evaluates the same card's template
variants 0 and 1 (or a source that fails to compile, remembered by the build cache), so the whole
file makes three distinct builds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest
import torch
import torch.nn as nn

from modulelens.search.model import NodeRecord, SearchSettings
from modulelens.search.tree import SearchTree

# --- the tree (pure) --------------------------------------------------------------------------


def _node(i, parent, cost=None, seq=0, status="evaluated", variant=None):
    """A node whose cost is ``cost`` (latency / eager); None is a rejection."""
    lineage = [] if parent is None else [0] if parent == 0 else [0, parent]
    if status == "evaluated" and cost is not None:
        return NodeRecord(node=i, parent=parent, lineage=lineage, status=status, seq=seq, verdict="custom",
                          correct=True, speedup_vs_eager=1 / cost, candidate_id=f"c{i}", variant=variant)
    return NodeRecord(node=i, parent=parent, lineage=lineage, status=status, seq=seq, verdict="rejected",
                      candidate_id=f"c{i}", variant=variant)


ROOT = NodeRecord(node=0, status="root")


def test_costs_visits_and_best():
    tree = SearchTree([ROOT, _node(1, 0, 0.8, 1), _node(2, 1, 0.5, 2), _node(3, 0, None, 3),
                       _node(4, 1, status="pending")])
    assert tree.visits(0) == 4 and tree.visits(1) == 3
    assert tree.mean_cost(1) == pytest.approx((0.8 + 0.5 + 1.0) / 3)  # pending counts as eager
    assert tree.mean_cost(3) == 2.0  # a rejection costs FAIL_COST
    assert tree.best().node == 2 and [n.node for n in tree.best_path()] == [0, 1, 2]
    assert [n.node for n in tree.pending()] == [4]


def test_a_nodes_value_is_its_speedups_lower_bound_and_only_determined_unflagged_nodes_can_be_best():
    def node(i, interval, speedup, flagged=False, seq=0):
        return NodeRecord(node=i, parent=0, lineage=[0], status="evaluated", seq=seq, verdict="custom", correct=True,
                          speedup_vs_eager=speedup, speedup_interval=interval, flagged=flagged, candidate_id=f"c{i}")

    sure = node(1, [1.8, 2.2], 2.0, seq=1)  # worth 1.8x surely
    wider = node(2, [1.2, 3.5], 2.4, seq=2)  # a higher point, but surely only 1.2x
    unsure = node(3, [0.5, 6.0], None, seq=3)  # undetermined: no figure, valued at its low end
    flagged = node(4, [40.0, 44.0], 42.0, flagged=True, seq=4)  # beyond belief
    assert sure.cost == pytest.approx(1 / 1.8) and wider.cost == pytest.approx(1 / 1.2) and unsure.cost == 2.0
    assert [n.usable for n in (sure, wider, unsure, flagged)] == [True, True, False, False]
    assert SearchTree([ROOT, sure, wider, unsure, flagged]).best().node == 1


def test_progressive_widening_then_uct_descends_to_the_cheaper_branch():
    s = SearchSettings(exploration=0.1, patience=5)
    tree = SearchTree([ROOT])
    assert tree.select(s, lambda n: True) == 0  # an empty root expands
    tree = SearchTree([ROOT, _node(1, 0, 0.9, 1)])
    assert tree.allowed_children(0, s) == 1
    assert tree.select(s, lambda n: True) == 1  # widening allows 1 child at 1 visit: go down
    tree = SearchTree([ROOT, _node(1, 0, 0.9, 1), _node(2, 1, 0.9, 2)])
    assert tree.allowed_children(0, s) == 2 and tree.select(s, lambda n: True) == 0  # 2 visits: a 2nd child
    tree = SearchTree([ROOT, _node(1, 0, 0.9, 1), _node(2, 1, 0.9, 2), _node(3, 0, 0.4, 3), _node(4, 3, 0.4, 4)])
    assert tree.select(s, lambda n: n.node != 0) == 3  # the root is full: the cheaper branch


def test_stagnant_branches_are_pruned_and_a_stagnant_root_stops():
    s = SearchSettings(patience=2, min_improvement=0.05)
    nodes = [ROOT, _node(1, 0, 0.5, 1), _node(2, 1, 0.49, 2), _node(3, 1, None, 3), _node(4, 0, 0.6, 4)]
    tree = SearchTree(nodes)
    assert tree.stagnant(1, s)  # 0.49 is no 5% improvement on 0.5, then a failure
    assert not tree.stagnant(4, s) and tree.stagnant(0, s)  # the root saw no improvement since node 1
    assert tree.select(s, lambda n: True) is None  # a stagnant root stops the search
    tree = SearchTree([*nodes[:4], _node(4, 0, 0.3, 4)])
    assert not tree.stagnant(0, s)
    assert tree.select(s, lambda n: n.node != 0) == 4  # branch 1 is pruned: never selected


def test_a_tree_with_nothing_to_expand_cannot_grow():
    tree = SearchTree([ROOT, _node(1, 0, 0.5, 1)])
    assert tree.select(SearchSettings(), lambda n: False) is None


def test_template_children_vary_a_parameter_not_yet_tried(monkeypatch):
    from modulelens.kernels import templates
    from modulelens.kernels import KernelSource
    from modulelens.ops import OpCard
    from modulelens.search.expansion import Expander
    from modulelens.search.model import SearchTarget

    monkeypatch.setattr(templates, "render", lambda card, backend, v: KernelSource(backend=backend, source=f"// v{v}"))
    card = OpCard(op="aten.native_layer_norm.default")
    e = Expander(card=card, target=SearchTarget(index=0, card_id="x/0", op=card.op, kind="memory"),
                 settings=SearchSettings())
    e._space = [{"grain": 1}, {"grain": 2}, {"grain": 3}, {"grain": 1, "stats": "onepass"}]

    def tpl(i, parent, variant):
        return NodeRecord(node=i, parent=parent, lineage=[0] if parent == 0 else [0, parent], status="evaluated",
                          seq=i, provider="template", variant=variant, candidate_id=f"c{i}")

    tree = SearchTree([ROOT])
    assert e.propose(None, tree, tree.nodes[0]).variant == 0  # the default first
    tree = SearchTree([ROOT, tpl(1, 0, 0), tpl(2, 1, 1)])
    assert e.propose(None, tree, tree.nodes[1]).variant == 3  # grain was tried: vary stats
    assert e.propose(None, tree, tree.nodes[0]).variant == 3  # the root varies the default the same way
    tree = SearchTree([ROOT, tpl(1, 0, 0), tpl(2, 1, 1), tpl(3, 1, 3), tpl(4, 1, 2)])
    assert not e.can_expand(tree, tree.nodes[0])  # every variant tried


# --- searches over a real card ----------------------------------------------------------------


class Act(nn.Module):
    def forward(self, x):
        return nn.functional.gelu(x) * 1.0


@pytest.fixture(scope="session")
def gelu_card(tmp_path_factory):
    import modulelens
    from modulelens.registry import ToolContext
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops

    repo = tmp_path_factory.mktemp("search-repo")
    with modulelens.capture("", name="act", repo=repo, export=False):
        Act()(torch.randn(32, 128))
    ops = capture_ops(CaptureOpsRequest(ref="act", repeats=3), ToolContext(repo_root=repo))
    card = next(c for c in ops.cards if c.op == "aten.gelu.default")
    return repo, card.card_id


@pytest.fixture(scope="session")
def template_search(gelu_card, app):
    """One template search of two evaluations, through the CLI."""
    from click.testing import CliRunner

    repo, card = gelu_card
    r = CliRunner().invoke(app, ["optimize", card, "--max-evals", "2", "--search-id", "tpl", "--repo", str(repo),
                                 "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _assert_best_by_interval(repo, search_id, target):
    """The decision, whatever the machine's load made of the timings: no best without a usable
    node (custom, correct, speedup determined, not flagged); else the finalists (usable nodes by
    lower bound) were re-measured together, and the best is the one whose interval's lower bound
    is highest there (or, when that re-measurement was undetermined, the tree's best)."""
    from modulelens.repo import Repository
    from modulelens.search.store import load_tree

    tree = load_tree(Repository(repo), search_id, 0)
    usable = sorted((n for n in tree.candidates if n.usable), key=lambda n: (n.cost, n.seq))
    if not usable:
        assert target["best_candidate"] is None and target["finalists"] == []
        return
    assert target["finalists"] == [n.candidate_id for n in usable[:3]]
    assert target["best_candidate"] in target["finalists"]
    if target["remeasured"]:
        low, high = target["speedup_interval"]
        assert low <= target["speedup_vs_eager"] <= high
    else:
        assert "re-measurement was not determined" in target["stopped_because"]
        assert target["best_candidate"] == usable[0].candidate_id


def _summary(repo, search_id):
    from modulelens.repo import Repository
    from modulelens.search.summary import search_summary

    return search_summary(Repository(repo), search_id)


@pytest.mark.slow
def test_template_search_finds_a_custom_kernel_and_reports_it(gelu_card, template_search, cli):
    repo, card = gelu_card
    out = template_search
    assert out["search_id"] == "tpl" and out["evaluations"] <= 2 and out["cost_usd"] == 0.0
    (target,) = out["targets"]
    assert target["target"] == card and target["evaluations"] == out["evaluations"]
    _assert_best_by_interval(repo, "tpl", target)
    assert out["stopped_because"] in ("max_evals", "roofline", "stagnated", "exhausted")
    tree = _summary(repo, "tpl").targets[0]
    evaluated = [n for n in tree.nodes if n.status == "evaluated"]
    assert {n.verdict for n in evaluated} == {"custom"} and [n.variant for n in evaluated] == list(range(len(evaluated)))
    if target["best_candidate"]:
        assert tree.best_path[0] == 0

    code, shown, r = cli("show", "search", "tpl", "--repo", repo, "--json")
    assert code == 0 and shown["targets"][0]["best_path"] == tree.best_path
    code, _, r = cli("show", "search", "tpl", "--repo", repo)
    assert code == 0 and (target["best_candidate"] or "custom") in r.stdout and "custom" in r.stdout

    # Rerunning continues the same tree: the budget is spent, nothing new is evaluated.
    code, again, r = cli("optimize", card, "--max-evals", "2", "--repo", repo, "--json")
    assert code == 0, r.output
    assert again["search_id"] == "tpl" and again["resumed"] is True and again["evaluations_this_run"] == 0
    assert again["targets"][0]["best_candidate"] == target["best_candidate"]


@pytest.mark.slow
def test_an_agent_adds_a_child_to_a_node(gelu_card, template_search, cli):
    from modulelens.kernels import templates
    from modulelens.ops import open_card
    from modulelens.repo import Repository

    repo, card = gelu_card
    source = templates.render(open_card(Repository(repo), card)[1], "cpp", 0).source  # built already
    code, node, r = cli("add-search-child", "tpl", "--parent", "1", "--source-text", source, "--repo", repo, "--json")
    assert code == 0, r.output
    assert node["provider"] == "agent" and node["parent"] == 1 and node["lineage"] == [0, 1]
    assert node["verdict"] == "custom" and node["status"] == "evaluated"
    code, _, r = cli("add-search-child", "nope", "--source-text", source, "--repo", repo, "--json")
    assert code == 2 and "no search named 'nope'" in r.output


@pytest.mark.slow
def test_a_search_killed_with_sigkill_resumes_with_its_nodes_intact(gelu_card, template_search, tmp_path):
    from modulelens.repo import Repository
    from modulelens.search.model import NODES
    from modulelens.search.store import load_tree

    repo, card = gelu_card
    args = [sys.executable, "-m", "modulelens", "optimize", card, "--max-evals", "2", "--search-id", "killed",
            "--patience", "5", "--repo", str(repo), "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    journal = repo / NODES / "killed.t0"
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            tree = load_tree(Repository(repo), "killed", 0) if journal.is_dir() else None
            if tree is not None and tree.evaluations >= 1:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the search ended before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {n.node: n for n in load_tree(Repository(repo), "killed", 0).candidates if n.done}
    assert before

    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["resumed"] is True and out["evaluations"] == 2
    after = load_tree(Repository(repo), "killed", 0)
    for i, node in before.items():  # earlier nodes intact
        assert after.nodes[i].model_dump(exclude={"created_at"}) == node.model_dump(exclude={"created_at"})
    assert all(n.status == "evaluated" for n in after.candidates)


# --- the ray executor ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_search_on_ray_gives_the_local_verdicts(gelu_card, template_search):
    """On a local Ray instance (2 CPUs) the same card's variants get the local executor's verdicts."""
    ray = pytest.importorskip("ray", reason="ray is an optional dependency: pip install 'modulelens[ray]'")
    from modulelens.repo import Repository
    from modulelens.search.executors import RayExecutor
    from modulelens.search.loop import run_search, start_or_resume
    from modulelens.search.model import SearchSettings
    from modulelens.search.targets import resolve_targets

    repo, card = gelu_card
    r = Repository(repo)
    settings = SearchSettings(max_evals=2)
    search, _ = start_or_resume(r, resolve_targets(r, [card], settings, 1), settings, executor="ray",
                                search_id="on-ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        executor = RayExecutor()
        out = run_search(r, search, executor)
    finally:
        ray.shutdown()
    local = {n.variant: n.verdict for n in _summary(repo, "tpl").targets[0].nodes if n.status == "evaluated"}
    remote_nodes = [n for n in _summary(repo, "on-ray").targets[0].nodes if n.status == "evaluated"]
    remote = {n.variant: n.verdict for n in remote_nodes}
    assert set(remote) & set(local) and all(local[v] == verdict for v, verdict in remote.items() if v in local)
    assert all(n.worker.startswith("ray:") and n.candidate_id for n in remote_nodes)
    assert all(n.report and n.report.startswith("act.card") for n in remote_nodes)  # reports back in the repository
    _assert_best_by_interval(repo, "on-ray", out.targets[0].model_dump())


# --- LLM providers driven by fakes ----------------------------------------------------------------

BROKEN = "```cpp\n#include <torch/extension.h>\ntorch::Tensor forward(torch::Tensor x, std::string a) { return x.nope(); }\n```"


def _fixed_reply(repo, card):
    from modulelens.kernels import templates
    from modulelens.ops import open_card
    from modulelens.repo import Repository

    return "Fixed:\n```cpp\n" + templates.render(open_card(Repository(repo), card)[1], "cpp", 0).source + "```\n"


def _search(repo, card, provider_name, search_id, provider=None, ctx=None, **settings):
    from modulelens.repo import Repository
    from modulelens.search.executors import LocalExecutor
    from modulelens.search.loop import run_search, start_or_resume
    from modulelens.search.targets import resolve_targets

    r = Repository(repo)
    s = SearchSettings(provider=provider_name, **settings)
    search, _ = start_or_resume(r, resolve_targets(r, [card], s, 1), s, executor="local", search_id=search_id)
    executor = LocalExecutor(1)
    try:
        return run_search(r, search, executor, provider=provider, ctx=ctx)
    finally:
        executor.close()


@pytest.fixture
def anthropic_env(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    for name in ("ANTHROPIC_BASE_URL", "MODULELENS_ANTHROPIC_MODEL", "MODULELENS_PRICE_IN", "MODULELENS_PRICE_OUT"):
        monkeypatch.delenv(name, raising=False)


def _anthropic(replies):
    from test_providers import FakeTransport, ok

    from modulelens.providers.anthropic import AnthropicProvider

    transport = FakeTransport(*[ok(text=t, tokens=(1000, 500)) for t in replies])
    return AnthropicProvider(transport, sleep=lambda s: None), transport


COST = (1000 * 3 + 500 * 15) / 1e6  # sonnet list prices


@pytest.mark.slow
def test_anthropic_repairs_a_compile_error_into_a_correct_child(gelu_card, anthropic_env):
    repo, card = gelu_card
    provider, transport = _anthropic([BROKEN, _fixed_reply(repo, card)])
    out = _search(repo, card, "anthropic", "llm", provider=provider, max_evals=2)
    tree = _summary(repo, "llm").targets[0]
    first, second = tree.nodes[1], tree.nodes[2]
    assert first.verdict == "rejected" and second.parent == 1 and second.verdict == "custom"
    repair_prompt = transport.calls[1]["body"]["messages"][0]["content"]
    assert "x.nope()" in repair_prompt and "nope" in repair_prompt.split("x.nope()")[1]  # parent + its error
    assert out.cost_usd == pytest.approx(2 * COST)
    _assert_best_by_interval(repo, "llm", out.targets[0].model_dump())  # the repaired child, if its speed was determined


@pytest.mark.slow
def test_the_money_budget_stops_the_search(gelu_card, anthropic_env):
    repo, card = gelu_card
    provider, transport = _anthropic([BROKEN, BROKEN, BROKEN])
    out = _search(repo, card, "anthropic", "money", provider=provider, max_evals=5, max_cost_usd=1.5 * COST)
    assert out.stopped_because == "max_cost" and len(transport.calls) == 2
    assert out.cost_usd == pytest.approx(2 * COST) and out.tree_size == 2


@pytest.mark.slow
def test_sampling_repairs_through_the_clients_model(gelu_card):
    repo, card = gelu_card
    replies, prompts = [BROKEN, _fixed_reply(repo, card)], []

    def sample(system, user, max_tokens):
        prompts.append(user)
        return replies[len(prompts) - 1], "client-model"

    out = _search(repo, card, "sampling", "sampled", ctx=types.SimpleNamespace(sample=sample), max_evals=2)
    tree = _summary(repo, "sampled").targets[0]
    assert [n.verdict for n in tree.nodes[1:]] == ["rejected", "custom"] and "x.nope()" in prompts[1]
    assert out.cost_usd == 0.0
    _assert_best_by_interval(repo, "sampled", out.targets[0].model_dump())


@pytest.mark.slow
def test_optimize_and_show_search_through_mcp_with_progress(gelu_card, template_search):
    import anyio
    from mcp import Client

    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    repo, card = gelu_card
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    async def main():
        async with Client(build_server(all_tools(), repo_root=repo)) as client:
            run = await client.call_tool("optimize", {"targets": [card], "max_evals": 2, "search_id": "tpl"},
                                         progress_callback=on_progress)
            shown = await client.call_tool("show", {"kind": "search", "ref": "tpl"})
            return run, shown

    run, shown = anyio.run(main)
    assert not run.is_error and run.structured_content["search_id"] == "tpl"
    target = run.structured_content["targets"][0]
    _assert_best_by_interval(repo, "tpl", target)
    if target["best_node"] is not None:  # an agent child may have become the best
        assert shown.structured_content["targets"][0]["best_path"][-1] == target["best_node"]
    assert seen and seen[0][1] == 2.0 and "search tpl" in seen[0][2]
    assert not shown.is_error and shown.structured_content["targets"][0]["target"] == card
