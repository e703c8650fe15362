"""The search: grow each target's tree until a budget is spent or no branch can improve, then
re-measure each target's finalists (its best usable nodes by the lower bound of their speedup
interval) together against eager on one worker, and call best the one whose interval has the
highest lower bound there; never a node whose speedup is undetermined or flagged.

Each iteration picks an active target (round robin), selects a node (:meth:`SearchTree.select`),
asks the expander for a child, stores the child as a candidate and a ``pending`` node, and hands
it to the executor; up to ``executor.workers`` evaluations run at once. Each completed evaluation
is written as the node's final record before anything else happens, so a kill loses at most the
evaluations in flight, which a rerun evaluates again (their candidates are stored: no provider is
asked twice). A target stops when its best reaches ``roofline_target`` of its roofline bound
and beats eager (``roofline``), when its root branch is stagnant (``stagnated``), or when nothing can grow
(``exhausted``); the search stops when every target has, or at the first budget spent
(``max_evals``, ``time_budget``, ``max_cost``).
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any

from modulelens.callbacks import ProgressFn
from modulelens.cancellation import CallCancelled
from modulelens.errors import ModuleLensError
from modulelens.kernels import KernelSource, candidate_name, load_candidate, save_candidate
from modulelens.ops import OpCard, open_card
from modulelens.providers.base import Provider
from modulelens.repo import Repository
from modulelens.search.executors import EvalResult, EvalTask, Executor, LocalExecutor, RemeasureRequest, store_result
from modulelens.search.expansion import Expander, Proposal
from modulelens.search.model import (
    SEARCHES,
    NodeRecord,
    SearchManifest,
    SearchResult,
    SearchSettings,
    SearchTarget,
    TargetOutcome,
)
from modulelens.search.store import find_search, load_tree, open_search, save_search, search_key, write_node
from modulelens.search.tree import ROOT, SearchTree
from modulelens.validation import MAX_BELIEVABLE_SPEEDUP, ValidationSettings


def _no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    pass


@dataclass
class _Target:
    spec: SearchTarget
    card: OpCard
    tree: SearchTree
    expander: Expander
    stopped: str | None = None


@dataclass
class _Run:
    repo: Repository
    search: SearchManifest
    targets: list[_Target]
    executor: Executor
    progress: ProgressFn
    started: float = field(default_factory=time.monotonic)
    in_flight: dict[concurrent.futures.Future, tuple[_Target, NodeRecord, EvalTask]] = field(default_factory=dict)
    evaluated_now: int = 0
    turn: int = 0

    @property
    def settings(self) -> SearchSettings:
        return self.search.settings

    def nodes(self) -> int:
        return sum(len(t.tree.candidates) for t in self.targets)

    def evaluations(self) -> int:
        return sum(t.tree.evaluations for t in self.targets)

    def cost(self) -> float:
        return sum(t.tree.cost_usd for t in self.targets)

    def budget_spent(self) -> str | None:
        s = self.settings
        if self.nodes() >= s.max_evals:
            return "max_evals"
        if s.time_budget_s is not None and time.monotonic() - self.started >= s.time_budget_s:
            return "time_budget"
        if s.max_cost_usd is not None and self.cost() >= s.max_cost_usd:
            return "max_cost"
        return None


# -- nodes ------------------------------------------------------------------------------------


def _save(run: _Run, target: _Target, node: NodeRecord) -> NodeRecord:
    stored = write_node(run.repo, run.search.search_id, target.spec.index, node)
    target.tree = SearchTree([*(n for n in target.tree.nodes.values() if n.node != node.node), stored])
    return stored


def _eval_task(run: _Run, target: _Target, candidate_id: str, src: KernelSource) -> EvalTask:
    s = run.settings
    settings = ValidationSettings(card_id=target.spec.card_id, seeds=list(range(s.seeds)), min_run_time=s.min_run_time)
    return EvalTask(repo=str(run.repo.root), candidate_id=candidate_id, source=src, settings=settings,
                    timeout_s=s.timeout_s, device=target.card.device)


def _dispatch(run: _Run, target: _Target, node: NodeRecord, src: KernelSource) -> None:
    node = _save(run, target, node.model_copy(update={"status": "pending", "attempts": node.attempts + 1}))
    task = _eval_task(run, target, node.candidate_id or "", src)
    run.in_flight[run.executor.submit(task)] = (target, node, task)


def _expand(run: _Run, target: _Target, parent: NodeRecord) -> None:
    tree = target.tree
    base = NodeRecord(node=tree.next_id(), parent=parent.node, lineage=[*parent.lineage, parent.node],
                      provider=run.settings.provider)
    try:
        proposal: Proposal = target.expander.propose(run.repo, tree, parent)
    except ModuleLensError as e:
        _save(run, target, base.model_copy(update={"status": "failed", "seq": tree.next_seq(), "reason": e.message,
                                                   "errors": [f"{e.message} ({e.hint})" if e.hint else e.message]}))
        return
    src = proposal.source
    base = base.model_copy(update={"variant": proposal.variant, "params": src.params, "source_sha256": src.sha256,
                                   "provider": src.provider, "cost_usd": proposal.cost_usd,
                                   "input_tokens": proposal.input_tokens, "output_tokens": proposal.output_tokens})
    twin = next((n for n in tree.candidates if n.source_sha256 == src.sha256), None)
    if twin is not None:  # the provider repeated itself: nothing new to measure
        _save(run, target, base.model_copy(update={"status": "failed", "seq": tree.next_seq(),
                                                   "reason": f"same source as node {twin.node}"}))
        return
    art = save_candidate(run.repo, target.card, src, parent=parent.candidate_id)
    _dispatch(run, target, base.model_copy(update={"candidate_id": art.ref}), src)


def _complete(run: _Run, future: concurrent.futures.Future) -> None:
    target, node, task = run.in_flight.pop(future)
    try:
        result: EvalResult = store_result(run.repo, task, future.result())
    except CallCancelled:  # the whole call was cancelled: the node stays pending (a rerun evaluates it)
        raise
    except Exception as e:  # noqa: BLE001 - an executor failure is this node's failure, not the search's
        _save(run, target, node.model_copy(update={"status": "failed", "seq": target.tree.next_seq(),
                                                   "reason": f"evaluation failed: {e}"}))
        return
    r = result.report
    timed = r.candidate is not None and r.eager is not None
    _save(run, target, node.model_copy(update={
        "status": "evaluated", "seq": target.tree.next_seq(), "verdict": r.verdict, "correct": r.correct,
        "reason": r.reason, "errors": r.errors[:5], "speedup_vs_eager": r.speedup_vs_eager,
        "speedup_interval": r.speedup_interval, "flagged": any(f.startswith("suspicious") for f in r.flags),
        "latency_s": r.candidate.median_s if timed else None, "p20_s": r.candidate.p20_s if timed else None,
        "p80_s": r.candidate.p80_s if timed else None, "eager_s": r.eager.median_s if timed else None,
        "worker": result.worker, "report": result.report_ref, "eval_seconds": result.seconds,
    }))
    run.evaluated_now += 1
    best = target.tree.best()
    run.progress(run.nodes(), run.settings.max_evals,
                 f"{target.spec.card_id} node {node.node}: {r.verdict}"
                 + (f" {r.speedup_vs_eager:.2f}x" if r.speedup_vs_eager else
                    " speed undetermined" if r.timing_status == "undetermined" else "")
                 + (f"; best {best.speedup_vs_eager:.2f}x" if best and best.speedup_vs_eager else ""))


# -- stopping ---------------------------------------------------------------------------------


def _roofline_fraction(target: _Target) -> float | None:
    best = target.tree.best()
    if best is None or not best.latency_s or not target.spec.bound_s:
        return None
    return target.spec.bound_s / best.latency_s


def _why_stopped(run: _Run, target: _Target) -> str | None:
    fraction, best = _roofline_fraction(target), target.tree.best()
    if fraction is not None and fraction >= run.settings.roofline_target and best and best.cost < 1:
        return "roofline"  # near the bound and faster than eager (data in cache can beat a DRAM bound)
    busy = any(t is target for t, _, _ in run.in_flight.values())
    if busy:
        return None
    if target.tree.stagnant(ROOT, run.settings):
        return "stagnated"
    if target.tree.select(run.settings, lambda n: target.expander.can_expand(target.tree, n)) is None:
        return "exhausted"
    return None


def _next_target(run: _Run) -> tuple[_Target, int] | None:
    """The next target (round robin) that has a node to expand now."""
    count = len(run.targets)
    for step in range(count):
        target = run.targets[(run.turn + step) % count]
        if target.stopped is None:
            target.stopped = _why_stopped(run, target)
        if target.stopped is not None:
            continue
        node = target.tree.select(run.settings, lambda n, t=target: t.expander.can_expand(t.tree, n))
        if node is not None:
            run.turn = (run.turn + step + 1) % count
            return target, node
    return None


def _grow(run: _Run) -> str:
    """Dispatch and complete evaluations until the search stops; returns why."""
    for target in run.targets:  # evaluations a killed run left in flight
        for node in target.tree.pending():
            _, src = load_candidate(run.repo, node.candidate_id or "")
            _dispatch(run, target, node, src)
    spent: str | None = None
    while True:
        spent = spent or run.budget_spent()
        while spent is None and len(run.in_flight) < run.executor.workers:
            pick = _next_target(run)
            if pick is None:
                break
            target, node = pick
            _expand(run, target, target.tree.nodes[node])
            spent = run.budget_spent()
        if not run.in_flight:
            break
        done, _ = concurrent.futures.wait(list(run.in_flight), return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
            _complete(run, future)
    for target in run.targets:
        target.stopped = target.stopped or _why_stopped(run, target) or spent
    if spent is not None:
        return spent
    return ", ".join(sorted({t.stopped or "stopped" for t in run.targets}))


# -- the final re-measurement -------------------------------------------------------------------


FINALISTS = 3  # best usable nodes of a target re-measured together at the end


def _outcome(run: _Run, target: _Target, previous: dict[str, TargetOutcome]) -> TargetOutcome:
    tree = target.tree
    out = TargetOutcome(target=target.spec.card_id, op=target.spec.op, evaluations=tree.evaluations,
                        nodes=len(tree.candidates), cost_usd=tree.cost_usd, stopped_because=target.stopped)
    finalists = sorted((n for n in tree.candidates if n.usable), key=lambda n: (n.cost, n.seq))[:FINALISTS]
    if not finalists:
        return out
    ids = [n.candidate_id or "" for n in finalists]
    before = previous.get(target.spec.card_id)
    if before is not None and before.remeasured and before.finalists == ids:
        return out.model_copy(update={k: getattr(before, k) for k in (
            "best_candidate", "best_node", "speedup_vs_eager", "speedup_interval", "speedup_vs_compile",
            "best_latency_s", "eager_latency_s", "roofline_fraction", "remeasured", "finalists")})
    run.progress(run.nodes(), run.settings.max_evals, f"re-measuring {len(ids)} finalist(s) of "
                 f"{target.spec.card_id} together against eager")
    sources = [load_candidate(run.repo, cid)[1] for cid in ids]
    result = run.executor.remeasure(RemeasureRequest(
        repo=str(run.repo.root), card_id=target.spec.card_id, sources=sources, device=target.card.device,
        min_run_time=2 * run.settings.min_run_time, timing_budget_s=max(3.0, 4 * len(ids) * run.settings.min_run_time)))
    out.finalists = ids
    ranked = [(m, n) for m, n in zip(result.measurements, finalists)
              if m is not None and m.status == "ok" and m.speedup is not None and m.speedup <= MAX_BELIEVABLE_SPEEDUP]
    if not ranked:
        why = "; ".join(sorted({r or (m.reason if m else "") for m, r in zip(result.measurements, result.reasons)}))
        best = finalists[0]
        out.best_candidate, out.best_node = best.candidate_id, best.node
        out.speedup_vs_eager, out.speedup_interval = best.speedup_vs_eager, best.speedup_interval
        out.best_latency_s, out.eager_latency_s = best.latency_s, best.eager_s
        out.stopped_because = (f"{out.stopped_because or ''}; the finalists' joint re-measurement was not "
                               f"determined ({why}): best by its validation").lstrip("; ")
        return out
    m, best = max(ranked, key=lambda mn: mn[0].lower or 0.0)
    out.best_candidate, out.best_node, out.remeasured = best.candidate_id, best.node, True
    out.speedup_vs_eager, out.speedup_interval = m.speedup, m.interval
    out.best_latency_s = m.candidate.median_s if m.candidate else None
    out.eager_latency_s = m.base.median_s if m.base else None
    if target.spec.bound_s and out.best_latency_s:
        out.roofline_fraction = target.spec.bound_s / out.best_latency_s
    if run.settings.compile_baseline:
        out.speedup_vs_compile = _versus_compile(run, target, best.candidate_id or "")
    return out


def _versus_compile(run: _Run, target: _Target, candidate_id: str) -> float | None:
    """The winner's speedup over torch.compile, from one validation with the compile baseline."""
    _, src = load_candidate(run.repo, candidate_id)
    task = _eval_task(run, target, candidate_id, src)
    task.settings = task.settings.model_copy(update={"compile_baseline": True,
                                                     "min_run_time": 2 * run.settings.min_run_time})
    single = LocalExecutor(1) if run.executor.name == "local" else run.executor
    try:
        return store_result(run.repo, task, single.submit(task).result()).report.speedup_vs_compile
    finally:
        if single is not run.executor:
            single.close()


# -- entry points -------------------------------------------------------------------------------


def _new_search_id(repo: Repository, targets: list[SearchTarget], key: str) -> str:
    stem = f"opt-{candidate_name(targets[0].card_id)}-{key[:6]}"
    taken = set(repo.names(SEARCHES))
    if stem not in taken:
        return stem
    return next(f"{stem}-{i}" for i in range(2, 10_000) if f"{stem}-{i}" not in taken)


def start_or_resume(repo: Repository, targets: list[SearchTarget], settings: SearchSettings, *, executor: str,
                    search_id: str | None = None, new: bool = False) -> tuple[SearchManifest, bool]:
    """The search to run: ``search_id`` when given (resumed if it exists), else the latest search
    with the same targets, provider and backend unless ``new``, else a new one. Budgets of a
    resumed search are the ones given now."""
    key = search_key(targets, settings)
    existing = None
    if search_id is not None and repo.versions(SEARCHES, search_id):
        existing = open_search(repo, search_id)
    elif search_id is None and not new:
        existing = find_search(repo, key)
    if existing is not None:
        if existing.key != key:
            raise ModuleLensError(f"search {existing.search_id} is over other targets or another provider/backend",
                                  "resume it with the same targets, [--provider] and [--backend], or start one with [--new]")
        resumed = existing.model_copy(update={"settings": settings, "executor": executor, "runs": existing.runs + 1})
        return resumed, True
    manifest = SearchManifest(search_id=search_id or _new_search_id(repo, targets, key), key=key, settings=settings,
                              targets=targets, executor=executor)
    return save_search(repo, manifest), False


def run_search(repo: Repository, search: SearchManifest, executor: Executor, *, ctx: Any = None,
               provider: Provider | None = None, progress: ProgressFn = _no_progress,
               resumed: bool = False) -> SearchResult:
    """Grow the trees of ``search`` with ``executor`` until it stops; store and return the outcome.
    ``provider`` overrides the provider named in the settings (tests drive fakes through it)."""
    targets = []
    for spec in search.targets:
        _, card = open_card(repo, spec.card_id)
        tree = load_tree(repo, search.search_id, spec.index)
        if ROOT not in tree.nodes:
            root = write_node(repo, search.search_id, spec.index, NodeRecord(node=ROOT, status="root"))
            tree = SearchTree([root])
        targets.append(_Target(spec=spec, card=card, tree=tree,
                               expander=Expander(card=card, target=spec, settings=search.settings, ctx=ctx,
                                                 provider=provider)))
    run = _Run(repo=repo, search=search, targets=targets, executor=executor, progress=progress)
    progress(run.nodes(), search.settings.max_evals, f"search {search.search_id}: {len(targets)} target(s)")
    stopped = _grow(run)
    previous = {o.target: o for o in search.outcome}
    outcome = [_outcome(run, t, previous) for t in run.targets]
    save_search(repo, search.model_copy(update={"outcome": outcome, "stopped_because": stopped}))
    return SearchResult(
        search_id=search.search_id, targets=outcome, evaluations=run.evaluations(),
        evaluations_this_run=run.evaluated_now, tree_size=run.nodes(), cost_usd=round(run.cost(), 6),
        stopped_because=stopped, resumed=resumed, executor=search.executor,
        seconds=time.monotonic() - run.started,
    )


def add_child(repo: Repository, search_id: str, target: str, parent: int, src: KernelSource,
              executor: Executor | None = None) -> tuple[str, NodeRecord]:
    """Add source the agent wrote as a child of node ``parent`` of the tree of ``target`` (a card id,
    or the target's index), evaluate it, and return (the target's card id, the node as stored)."""
    search = open_search(repo, search_id)
    spec = next((t for t in search.targets if target in (t.card_id, str(t.index))), None)
    if spec is None and target:
        _, card = open_card(repo, target)
        spec = next((t for t in search.targets if t.card_id == card.card_id), None)
    if spec is None:
        raise ModuleLensError(f"search {search_id} has no target {target!r}",
                              f"its targets: {', '.join(t.card_id for t in search.targets)}")
    _, card = open_card(repo, spec.card_id)
    tree = load_tree(repo, search_id, spec.index)
    if parent not in tree.nodes:
        raise ModuleLensError(f"the tree of {spec.card_id} has no node {parent}",
                              f"its nodes: 0 to {max(tree.nodes)}; see show (kind search, ref {search_id})")
    own = executor or LocalExecutor(1)
    run = _Run(repo=repo, search=search, targets=[], executor=own, progress=_no_progress)
    t = _Target(spec=spec, card=card, tree=tree, expander=Expander(card=card, target=spec, settings=search.settings))
    run.targets.append(t)
    p = tree.nodes[parent]
    src = src.model_copy(update={"provider": "agent"})
    art = save_candidate(repo, card, src, parent=p.candidate_id)
    node = NodeRecord(node=tree.next_id(), parent=parent, lineage=[*p.lineage, parent], provider="agent",
                      candidate_id=art.ref, source_sha256=src.sha256)
    try:
        _dispatch(run, t, node, src)
        for future in list(run.in_flight):
            future.result()
            _complete(run, future)
    finally:
        if executor is None:
            own.close()
    return spec.card_id, t.tree.nodes[node.node]
