"""A search shown compactly: per target, the best path and every node's verdict and latency."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.listing import LeftOut, keep_first_each
from modulelens.ops import resolved_card_id
from modulelens.replies import ToolReply
from modulelens.repo import Repository
from modulelens.search.model import NODES, SEARCHES, NodeRecord, SearchSettings, TargetOutcome
from modulelens.search.store import journal_name, load_tree, open_search
from modulelens.search.tree import ROOT


class NodeLine(BaseModel):
    node: int
    parent: int | None
    depth: int
    status: str
    verdict: str | None = None
    speedup_vs_eager: float | None = None
    speedup_interval: list[float] | None = Field(None, description="95% interval; the node's value uses its low end.")
    latency_s: float | None = None
    candidate_id: str | None = None
    provider: str | None = None
    variant: int | None = None
    cost_usd: float = 0.0
    worker: str | None = None
    report: str | None = None
    reason: str = ""
    best: bool = Field(False, description="On the path from the root to the best node.")


class TargetTree(BaseModel):
    target: str
    op: str
    nodes: list[NodeLine]
    best_path: list[int]
    outcome: TargetOutcome | None = None


class SearchSummary(ToolReply):
    search_id: str
    settings: SearchSettings
    executor: str
    runs: int
    stopped_because: str | None = None
    targets: list[TargetTree]
    left_out: list[LeftOut] = Field(default_factory=list, description="Node lists cut short (`limit` nodes in all).")


def _line(n: NodeRecord, on_path: set[int]) -> NodeLine:
    return NodeLine(node=n.node, parent=n.parent, depth=len(n.lineage), status=n.status, verdict=n.verdict,
                    speedup_vs_eager=n.speedup_vs_eager, speedup_interval=n.speedup_interval, latency_s=n.latency_s,
                    candidate_id=n.candidate_id,
                    provider=n.provider, variant=n.variant, cost_usd=n.cost_usd, worker=n.worker, report=n.report,
                    reason=n.reason, best=n.node in on_path)


def search_summary(repo: Repository, search_id: str, limit: int | None = None) -> SearchSummary:
    """The stored state of the search ``search_id`` (a clear error when there is none), with at
    most about ``limit`` node lines in all, shared among its targets (None: every node); each
    target keeps the first of its nodes in depth-first order (the root and the top of the tree)."""
    search = open_search(repo, search_id)
    outcomes = {o.target: o for o in search.outcome}
    targets = []
    for spec in search.targets:
        tree = load_tree(repo, search_id, spec.index)
        outcome = outcomes.get(spec.card_id)
        path = [n.node for n in tree.best_path(outcome.best_node if outcome else None)] if tree.nodes else []
        lines = [_line(n, set(path)) for n in _depth_first(tree)]
        targets.append(TargetTree(target=spec.card_id, op=spec.op, nodes=lines, best_path=path, outcome=outcome))
    summary = SearchSummary(search_id=search.search_id, settings=search.settings, executor=search.executor,
                            runs=search.runs, stopped_because=search.stopped_because, targets=targets)
    journals = {spec.card_id: str(repo.root / NODES / journal_name(search_id, spec.index)) for spec in search.targets}
    return keep_first_each(summary, "targets", "nodes", limit, lambda _, tree: journals[tree.target])


def _depth_first(tree) -> list[NodeRecord]:
    if ROOT not in tree.nodes:
        return []
    out, stack = [], [ROOT]
    while stack:
        node = stack.pop()
        out.append(tree.nodes[node])
        stack.extend(reversed([c.node for c in tree.children(node)]))
    return out


class SearchEntry(BaseModel):
    """One search, in a listing: its targets and, per target, the best result so far."""

    search_id: str
    provider: str
    backend: str
    executor: str
    runs: int
    created_at: str
    targets: list[str] = Field(description="The card ids searched.")
    best: list[TargetOutcome] = Field(default_factory=list, description="Per target, after the last run.")
    stopped_because: str | None = None


def search_entries(repo: Repository, card: str | None = None) -> list[SearchEntry]:
    """Every search in the repository, oldest first; only those searching ``card`` when given (a
    card id such as ``blk/6``; its opset reference is resolved first)."""
    wanted = resolved_card_id(repo, card) if card else None
    out = []
    for name in repo.names(SEARCHES):
        s = open_search(repo, name)
        cards = [t.card_id for t in s.targets]
        if wanted is not None and wanted not in cards:
            continue
        out.append(SearchEntry(search_id=s.search_id, provider=s.settings.provider, backend=s.settings.backend,
                               executor=s.executor, runs=s.runs, created_at=s.created_at, targets=cards,
                               best=s.outcome, stopped_because=s.stopped_because))
    return sorted(out, key=lambda e: e.created_at)
