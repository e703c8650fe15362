"""optimize: search many candidate kernels per card with a persistent tree search; keep the best."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.kernels import BackendName
from modulelens.registry import ToolContext, tool
from modulelens.replies import call
from modulelens.repo import Repository
from modulelens.search.executors import make_executor
from modulelens.search.loop import run_search, start_or_resume
from modulelens.search.model import ExecutorName, SearchResult, SearchSettings
from modulelens.search.targets import resolve_targets
from modulelens.timing import surely_above_one


class OptimizeRequest(BaseModel):
    targets: list[str] = Field(description="Card ids (blk/6) or captures.", json_schema_extra={"cli": "argument"})
    provider: str = Field("template", description="template, anthropic or sampling.")
    backend: BackendName = Field("cpp")
    max_evals: int = Field(24, ge=1, description="Whole search.")
    time_budget: float | None = Field(None, gt=0, description="Seconds for this run.")
    max_cost: float | None = Field(None, ge=0, description="USD, whole search.")
    executor: ExecutorName = Field("local")
    address: str | None = Field(None, description="Ray cluster address.")
    workers: int = Field(1, ge=1, description="Evaluations at once.")
    top: int = Field(3, ge=1, le=20, description="Cards per capture target.")
    roofline_target: float = Field(1.0, gt=0, description="Stop a card at this roofline fraction.")
    patience: int = Field(2, ge=1, description="Prune after N results without gain.")
    compile_baseline: bool = Field(False, description="Also time torch.compile.")
    search_id: str | None = Field(None, description="Resume or name a search.")
    new: bool = Field(False, description="Start a new search.")


@tool
def optimize(req: OptimizeRequest, ctx: ToolContext) -> SearchResult:
    """Tree-search kernels for cards, or a capture's top cards and the module itself (resumable)."""
    from modulelens.ops import is_card_id
    from modulelens.search.modules import search_module

    repo = Repository(ctx.repo_root)
    settings = SearchSettings(provider=req.provider, backend=req.backend, max_evals=req.max_evals,
                              time_budget_s=req.time_budget, max_cost_usd=req.max_cost,
                              roofline_target=req.roofline_target, patience=req.patience,
                              compile_baseline=req.compile_baseline)
    targets = resolve_targets(repo, req.targets, settings, req.top)
    search, resumed = start_or_resume(repo, targets, settings, executor=req.executor, search_id=req.search_id,
                                      new=req.new)
    executor = make_executor(req.executor, req.workers, req.address)
    try:
        result = run_search(repo, search, executor, ctx=ctx, progress=ctx.progress, resumed=resumed)
    finally:
        executor.close()
    for ref in (r for r in req.targets if not is_card_id(r)):
        module = search_module(repo, ref, settings, ctx.progress, ctx=ctx, search_id=result.search_id,
                               spent_usd=result.cost_usd)
        result.modules.append(module)
        result.cost_usd += module.cost_usd
        if module.best_candidate is None and module.stopped_because:
            result.warnings.append(f"module level of {module.capture}: {module.stopped_because}")
    # a level's best is only a winner to pack when it is surely faster than eager (pack decides the same way)
    bests = [(t.target, t.best_candidate, t.speedup_interval) for t in result.targets if t.best_candidate]
    bests += [(m.capture, m.best_candidate, m.speedup_interval) for m in result.modules if m.best_candidate]
    result.pack_candidates = [ref for _, ref, interval in bests if surely_above_one(interval)]
    for target, ref, interval in bests:
        if ref not in result.pack_candidates:
            low = f"{interval[0]:.2f}x" if interval else "unknown"
            result.warnings.append(f"{target}: its best, {ref}, is not surely faster than eager (interval lower "
                                   f"bound {low}): not suggested for the pack")
    for t in result.targets:
        if t.best_candidate is None:
            result.warnings.append(f"{t.target}: no correct custom kernel with a determined, believable speedup found"
                                   + (f" ({t.stopped_because})" if t.stopped_because else ""))
        elif not t.remeasured:
            result.warnings.append(f"{t.target}: the best speedup was not re-measured at the end; treat it as a hint")
    result.next = [call("show", kind="searches", ref=result.search_id)]
    if result.pack_candidates:
        result.next.append(call("pack", candidates=result.pack_candidates))
    return result
