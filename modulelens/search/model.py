"""The records of a search: its settings, its targets, its nodes and its outcome.

A node's *cost* is what the search minimises: one over the lower bound of the 95% interval of its
speedup over eager, measured by the same validation in the same worker, so costs from different
workers or machines are comparable and a node is valued at what it surely gains, not at one
figure (a noisy measurement has a low lower bound and costs more); raw latencies are kept for
display only. Failures (rejected, not timed, generation failed) cost :data:`FAIL_COST`. Only a
custom, correct node whose speedup was determined and not flagged as beyond belief can be a
target's best (:attr:`NodeRecord.usable`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from modulelens.kernels.source import BackendName
from modulelens.replies import ToolReply
from modulelens.repo import ManifestBase

SEARCHES = "searches"
NODES = "search_nodes"
FAIL_COST = 2.0  # a failure costs as much as a candidate twice slower than eager
MAX_COST = 2.0  # slower candidates are capped there, so one bad node cannot dominate a mean

NodeStatus = Literal["root", "pending", "evaluated", "failed"]
Verdict = Literal["custom", "wrapper", "rejected"]
ExecutorName = Literal["local", "ray"]


class SearchSettings(BaseModel):
    """How a search runs. Budgets in evaluations and money are totals of the search (a rerun
    continues until they are spent); the wall-time budget is per run."""

    provider: str = Field("template", description="template, anthropic, sampling (agent children come through add_search_child).")
    backend: BackendName = "cpp"
    max_evals: int = Field(24, ge=1, description="Evaluations in the whole search (all targets).")
    time_budget_s: float | None = Field(None, gt=0, description="Wall seconds for this run.")
    max_cost_usd: float | None = Field(None, ge=0, description="Provider spend for the whole search (USD).")
    roofline_target: float = Field(1.0, gt=0, description="A target is done when its best reaches this fraction of its roofline bound (and beats eager).")
    exploration: float = Field(0.5, ge=0, description="UCT exploration constant (costs are latency / eager).")
    widening: float = Field(1.0, gt=0, description="Progressive widening: a node may have ceil(widening * visits ** widening_power) children.")
    widening_power: float = Field(0.5, gt=0, le=1)
    patience: int = Field(2, ge=1, description="A branch whose last `patience` results did not improve its best is pruned.")
    min_improvement: float = Field(0.03, ge=0, description="Relative cost drop that counts as an improvement.")
    seeds: int = Field(1, ge=1, le=10, description="Fresh-input seeds per validation.")
    min_run_time: float = Field(0.2, gt=0, description="Seconds of timed calls per validation.")
    compile_baseline: bool = Field(False, description="Also time torch.compile in the final re-measurement.")
    timeout_s: float = Field(900.0, gt=0, description="Seconds a sandbox evaluation may take.")


class SearchTarget(BaseModel):
    """One card searched, with what the search knows about it before starting."""

    index: int
    card_id: str = Field(description="The card, as a resolved id (blk:v1/6).")
    op: str
    kind: str
    time_share: float = 0.0
    eager_s: float | None = Field(None, description="Eager seconds per call recorded on the card.")
    bound_s: float | None = Field(None, description="Roofline bound per call: bytes moved / copy bandwidth (memory cards).")


class TargetOutcome(BaseModel):
    target: str = Field(description="The card id.")
    op: str
    best_candidate: str | None = Field(None, description="The custom candidate whose speedup interval has the highest "
                                       "lower bound among the finalists re-measured together (never an undetermined "
                                       "or flagged one).")
    best_node: int | None = None
    speedup_vs_eager: float | None = Field(None, description="From the final interleaved re-measurement on one worker.")
    speedup_interval: list[float] | None = Field(None, description="Its 95% interval [low, high].")
    speedup_vs_compile: float | None = None
    finalists: list[str] = Field(default_factory=list, description="Candidates re-measured together at the end.")
    best_latency_s: float | None = None
    eager_latency_s: float | None = None
    roofline_fraction: float | None = Field(None, description="Roofline bound / best latency (memory cards).")
    evaluations: int = 0
    nodes: int = 0
    cost_usd: float = 0.0
    stopped_because: str | None = Field(None, description="Why this target's tree stopped growing, if it did.")
    remeasured: bool = False


class SearchManifest(ManifestBase):
    """The manifest of a ``searches`` artifact: v1 when the search starts, a new version with the
    outcome at the end of every run."""

    search_id: str
    key: str = Field(description="sha256 of the targets, provider and backend: how a rerun finds its search.")
    settings: SearchSettings
    targets: list[SearchTarget]
    executor: ExecutorName = "local"
    runs: int = 1
    outcome: list[TargetOutcome] = Field(default_factory=list)
    stopped_because: str | None = None


class NodeRecord(ManifestBase):
    """One node of a target's tree, as the last write left it (a version of its journal)."""

    node: int = Field(description="Node id within the tree; 0 is the root (eager, no candidate).")
    parent: int | None = None
    lineage: list[int] = Field(default_factory=list, description="Ancestors from the root, excluding the node.")
    status: NodeStatus = "pending"
    seq: int = Field(0, description="Completion order within the tree (0 while pending).")
    candidate_id: str | None = None
    source_sha256: str | None = None
    provider: str | None = None
    variant: int | None = Field(None, description="Template variant, for template children.")
    params: dict = Field(default_factory=dict)
    verdict: Verdict | None = None
    correct: bool = False
    reason: str = ""
    errors: list[str] = Field(default_factory=list, description="Short compile/runtime errors, for repair prompts.")
    latency_s: float | None = Field(None, description="Candidate median seconds per call.")
    p20_s: float | None = None
    p80_s: float | None = None
    eager_s: float | None = Field(None, description="Eager median measured by the same validation (same worker).")
    speedup_vs_eager: float | None = Field(None, description="Null when not timed or undetermined.")
    speedup_interval: list[float] | None = Field(None, description="95% interval [low, high]; the cost uses low.")
    flagged: bool = Field(False, description="The validation flagged the speedup as beyond belief.")
    worker: str | None = Field(None, description="Which worker measured it.")
    report: str | None = Field(None, description="Reference of the stored validation report.")
    cost_usd: float = Field(0.0, description="Provider spend to generate it.")
    input_tokens: int = 0
    output_tokens: int = 0
    attempts: int = Field(0, description="Evaluations started (more than 1 after a run was killed mid-evaluation).")
    eval_seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.status in ("evaluated", "failed")

    @property
    def cost(self) -> float | None:
        """What the search minimises (see the module docstring); None while pending or for the root."""
        if not self.done:
            return None
        low = self.speedup_interval[0] if self.speedup_interval else self.speedup_vs_eager
        if self.verdict in ("custom", "wrapper") and self.correct and low:
            cost = min(MAX_COST, 1.0 / low)
            return max(cost, 1.0) if self.verdict == "wrapper" else cost  # a wrapper is no better than eager
        return FAIL_COST

    @property
    def usable(self) -> bool:
        """A custom, correct candidate whose speedup was determined and not flagged: one that can
        be the result."""
        return (self.status == "evaluated" and self.verdict == "custom" and self.correct
                and bool(self.speedup_vs_eager) and not self.flagged)


class ModuleNode(BaseModel):
    """One module candidate of a capture's module level, with its latest validation."""

    candidate: str
    parent: str | None = Field(None, description="The candidate it repairs or improves (LLM children).")
    provider: str
    verdict: str | None = None
    correct: bool = False
    reason: str = ""
    speedup_vs_eager: float | None = None


class ModuleOutcome(BaseModel):
    """The module level of a capture target: ModelNew candidates for the captured module itself."""

    capture: str
    class_path: str = ""
    best_candidate: str | None = Field(None, description="The correct module candidate whose speedup interval has "
                                       "the highest lower bound (never an undetermined or flagged one).")
    speedup_vs_eager: float | None = Field(None, description="From its validation.")
    speedup_interval: list[float] | None = Field(None, description="Its 95% interval [low, high].")
    evaluations: int = Field(0, description="Module candidates validated by this run.")
    nodes: list[ModuleNode] = Field(default_factory=list, description="Module candidates of the capture, validated.")
    cost_usd: float = Field(0.0, description="Provider spend on this module level in this search (all runs).")
    template_note: str | None = Field(None, description="Why no module template fits, or where children come from.")
    stopped_because: str | None = Field(None, description="Why the LLM children stopped, when not for the budget.")


class SearchResult(ToolReply):
    """What optimize returns."""

    search_id: str
    targets: list[TargetOutcome]
    evaluations: int = Field(description="Evaluations in the whole search (all runs).")
    evaluations_this_run: int = 0
    tree_size: int = Field(description="Nodes in all trees, roots excluded.")
    cost_usd: float = Field(description="Provider spend of the whole search.")
    stopped_because: str
    resumed: bool = Field(False, description="This run continued an existing search.")
    modules: list[ModuleOutcome] = Field(default_factory=list, description="The module level of each capture target.")
    pack_candidates: list[str] = Field(default_factory=list, description="The winners of both levels surely faster "
                                       "than eager: pass them to pack (a module entry and the card entries inside "
                                       "it never both fire).")
    executor: ExecutorName = "local"
    seconds: float = 0.0
