"""Expanding a node: ask a provider for a child, given what the tree knows.

* ``template``: the template variants of the card are the search space. The root's first child
  is variant 0 (each family's default), its later children and a candidate's children are the
  untried variant whose parameters differ least from the parent's (the default's, for the root) (one parameter change when
  there is one), preferring a parameter that has not been varied yet (after a block size that did
  not help, try the algorithm switch rather than another block size). A tree whose variants are
  all tried cannot grow.
* LLM providers (``anthropic``, ``sampling``): a child of the root is a fresh kernel (the number of
  siblings is its diversity hint); a child of a candidate gets the parent's source and validation
  report (a repair when it failed, an improvement otherwise), plus, in the instructions, the errors
  of the node's failed children (so a repair does not repeat them) and the gap to the roofline.
* agent children come through :func:`modulelens.search.loop.add_child`, not through here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modulelens.kernels import KernelSource, load_candidate
from modulelens.ops import OpCard
from modulelens.providers.base import Provider, get_provider
from modulelens.providers.request import GenerationRequest
from modulelens.search.model import NodeRecord, SearchSettings, SearchTarget
from modulelens.search.tree import ROOT, SearchTree
from modulelens.validation import latest_report

MAX_SIBLING_ERRORS = 3


@dataclass
class Proposal:
    """A child's source and what it cost to get."""

    source: KernelSource
    variant: int | None = None
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def proposal_from(src: KernelSource, variant: int | None = None) -> Proposal:
    p = src.provenance
    return Proposal(source=src, variant=variant, cost_usd=_number(p.get("cost_usd")),
                    input_tokens=int(_number(p.get("input_tokens"))), output_tokens=int(_number(p.get("output_tokens"))))


@dataclass
class Expander:
    """Makes children for one target's tree. ``provider`` overrides the provider looked up by name
    (tests drive the LLM providers through fakes this way); ``ctx`` is the tool context (the
    sampling provider asks the MCP client through it)."""

    card: OpCard
    target: SearchTarget
    settings: SearchSettings
    ctx: Any = None
    provider: Provider | None = None
    _space: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def is_template(self) -> bool:
        return self.settings.provider == "template" and self.provider is None

    def space(self) -> list[dict[str, Any]]:
        if self._space is None:
            from modulelens.kernels import template_params

            self._space = template_params(self.card, self.settings.backend)
        return self._space

    def _untried(self, tree: SearchTree) -> list[int]:
        tried = {n.variant for n in tree.candidates if n.provider == "template"}
        return [i for i in range(len(self.space())) if i not in tried]

    def can_expand(self, tree: SearchTree, node: NodeRecord) -> bool:
        if node.node != ROOT and (node.status != "evaluated" or node.candidate_id is None):
            return False  # pending, or its generation failed: nothing to build on
        return bool(self._untried(tree)) if self.is_template else True

    def propose(self, repo, tree: SearchTree, node: NodeRecord) -> Proposal:
        """The child of ``node``; raises ModuleLensError when the provider cannot make one."""
        if self.is_template:
            return self._template_child(tree, node)
        request = GenerationRequest(card=self.card, backend=self.settings.backend,
                                    instructions=self._context(tree, node) or None,
                                    variant=len(tree.children(node.node)))
        if node.node != ROOT and node.candidate_id:
            art, parent_src = load_candidate(repo, node.candidate_id)
            report = latest_report(repo, art)
            request.parent = parent_src
            request.parent_report = report.model_dump(mode="json") if report else None
        provider = self.provider or get_provider(self.settings.provider)
        return proposal_from(provider.generate(request, self.ctx))

    def _template_child(self, tree: SearchTree, node: NodeRecord) -> Proposal:
        from modulelens.kernels import render_template

        untried, space = self._untried(tree), self.space()
        base = node.variant if node.node != ROOT and node.variant is not None else 0  # the root varies the default
        if base in untried:
            variant = base
        else:
            here = space[base]
            tried_axes = [_changed(here, space[n.variant]) for n in tree.candidates
                          if n.provider == "template" and n.variant is not None]
            variant = min(untried, key=lambda i: (len(_changed(here, space[i])),
                                                  tried_axes.count(_changed(here, space[i])), i))
        src = render_template(self.card, self.settings.backend, variant)
        src = src.model_copy(update={"provenance": {**src.provenance, "provider": "template", "variants": len(self.space())}})
        return proposal_from(src, variant)

    def _context(self, tree: SearchTree, node: NodeRecord) -> str:
        """Instructions for an LLM: failed siblings' errors and the gap to the roofline."""
        lines: list[str] = []
        failed = [c for c in tree.children(node.node) if c.done and not c.correct and c.errors][-MAX_SIBLING_ERRORS:]
        if failed:
            lines.append("Earlier attempts from the same starting point failed; do not repeat these errors:")
            lines += [f"- {c.reason}: {c.errors[0][:500]}" for c in failed]
        best = tree.best()
        if self.target.bound_s and best is not None and best.latency_s:
            lines.append(f"The roofline bound of this operator on this machine is {self.target.bound_s * 1e6:.1f} us per "
                         f"call (bytes moved / copy bandwidth); the best candidate so far takes "
                         f"{best.latency_s * 1e6:.1f} us ({self.target.bound_s / best.latency_s:.0%} of the bound).")
        return "\n".join(lines)


def _changed(a: dict[str, Any], b: dict[str, Any]) -> frozenset[str]:
    """The parameters whose values differ between two variants."""
    return frozenset(k for k in set(a) | set(b) if a.get(k) != b.get(k))
