"""A target's search tree: statistics derived from its node records, and which node to grow next.

Nothing here is stored: visits, mean costs, bests and stagnation are recomputed from the nodes
(their status, cost and completion order), so a tree read back after a kill has exactly the
statistics it had. A pending node counts as one visit of cost 1.0 (eager), a "virtual loss" that
keeps parallel workers from all descending the same path.

Selection (:meth:`SearchTree.select`) walks down from the root. At each node: if it may grow
(:data:`CanExpand`) and has fewer children than progressive widening allows
(``ceil(widening * visits ** widening_power)``), it is expanded; otherwise the search descends into
the child with the lowest UCT score for minimisation, ``mean cost - c * sqrt(ln N(parent) / N(child))``,
among children whose branch can still grow. Branches whose last ``patience`` results did not
improve their best by ``min_improvement`` are stagnant: pruned, never selected nor expanded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from modulelens.search.model import NodeRecord, SearchSettings

CanExpand = Callable[[NodeRecord], bool]
PENDING_COST = 1.0
ROOT = 0


class SearchTree:
    def __init__(self, nodes: list[NodeRecord]):
        self.nodes: dict[int, NodeRecord] = {n.node: n for n in nodes}
        self._children: dict[int, list[int]] = {i: [] for i in self.nodes}
        for n in sorted(self.nodes.values(), key=lambda n: n.node):
            if n.parent is not None:
                self._children.setdefault(n.parent, []).append(n.node)

    # -- structure --------------------------------------------------------------------------
    def children(self, node: int) -> list[NodeRecord]:
        return [self.nodes[c] for c in self._children.get(node, [])]

    def subtree(self, node: int) -> list[NodeRecord]:
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            out.append(self.nodes[n])
            stack.extend(self._children.get(n, []))
        return out

    def next_id(self) -> int:
        return max(self.nodes) + 1

    def next_seq(self) -> int:
        return max((n.seq for n in self.nodes.values()), default=0) + 1

    @property
    def candidates(self) -> list[NodeRecord]:
        """Every node but the root."""
        return [n for i, n in sorted(self.nodes.items()) if i != ROOT]

    @property
    def evaluations(self) -> int:
        return sum(n.status == "evaluated" for n in self.nodes.values())

    @property
    def cost_usd(self) -> float:
        return sum(n.cost_usd for n in self.nodes.values())

    def pending(self) -> list[NodeRecord]:
        return [n for n in self.candidates if n.status == "pending"]

    # -- statistics -------------------------------------------------------------------------
    def _costs(self, node: int) -> list[float]:
        return [n.cost if n.done else PENDING_COST for n in self.subtree(node) if n.status != "root"]

    def visits(self, node: int) -> int:
        return len(self._costs(node))

    def mean_cost(self, node: int) -> float:
        costs = self._costs(node)
        return sum(costs) / len(costs) if costs else PENDING_COST

    def best(self, node: int = ROOT) -> NodeRecord | None:
        """The usable node of lowest cost in the subtree (earliest on ties)."""
        usable = [n for n in self.subtree(node) if n.usable]
        return min(usable, key=lambda n: (n.cost, n.seq)) if usable else None

    def best_path(self, chosen: int | None = None) -> list[NodeRecord]:
        """Root to the node ``chosen`` (the search's outcome: the finalists' re-measurement may rank
        them otherwise than their validations did), else to the best node."""
        best = self.nodes[chosen] if chosen in self.nodes else self.best()
        if best is None:
            return [self.nodes[ROOT]]
        return [self.nodes[i] for i in best.lineage] + [best]

    def stagnant(self, node: int, settings: SearchSettings) -> bool:
        """Whether the branch at ``node`` made no improvement in its last ``patience`` results."""
        done = sorted((n for n in self.subtree(node) if n.done), key=lambda n: n.seq)
        best, since = math.inf, 0
        for n in done:
            if n.cost < best * (1 - settings.min_improvement):
                best, since = n.cost, 0
            else:
                since += 1
        return since >= settings.patience

    # -- selection --------------------------------------------------------------------------
    def allowed_children(self, node: int, settings: SearchSettings) -> int:
        return math.ceil(settings.widening * max(1, self.visits(node)) ** settings.widening_power)

    def select(self, settings: SearchSettings, can_expand: CanExpand) -> int | None:
        """The node to expand next, or None when no branch can grow."""
        growable: dict[int, bool] = {}

        def may_grow_here(n: NodeRecord) -> bool:
            return can_expand(n) and (n.node == ROOT or not self.stagnant(n.node, settings))

        def grows(node: int) -> bool:
            if node not in growable:
                n = self.nodes[node]
                pruned = node != ROOT and self.stagnant(node, settings)
                growable[node] = not pruned and (may_grow_here(n) or any(grows(c.node) for c in self.children(node)))
            return growable[node]

        if self.stagnant(ROOT, settings) or not grows(ROOT):
            return None
        node = ROOT
        while True:
            here = may_grow_here(self.nodes[node])
            kids = [c for c in self.children(node) if grows(c.node)]
            if here and (len(self.children(node)) < self.allowed_children(node, settings) or not kids):
                return node
            if not kids:
                return None
            parent_visits = max(1, self.visits(node))
            node = min(kids, key=lambda c: (self.mean_cost(c.node) - settings.exploration * math.sqrt(
                math.log(parent_visits) / max(1, self.visits(c.node))), c.node)).node
