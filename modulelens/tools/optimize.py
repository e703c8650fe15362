"""optimize: search many candidate kernels per card with a persistent tree search; keep the best."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.kernels.source import BackendName
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.search.executors import make_executor
from modulelens.search.loop import run_search, start_or_resume
from modulelens.search.model import ExecutorName, SearchResult, SearchSettings
from modulelens.search.targets import resolve_targets


class OptimizeRequest(BaseModel):
    targets: list[str] = Field(description="Card ids (blk/6) or captures (blk: its top cards by time share x headroom "
                               "to the roofline).", json_schema_extra={"cli": "argument"})
    provider: str = Field("template", description="template (its variants are the search space), anthropic or sampling.")
    backend: BackendName = Field("cpp", description="cpp (runs on any CPU), triton or cuda.")
    max_evals: int = Field(24, ge=1, description="Evaluations for the whole search (a rerun continues up to it).")
    time_budget: float | None = Field(None, gt=0, description="Wall seconds for this run.")
    max_cost: float | None = Field(None, ge=0, description="USD the provider may spend in the whole search.")
    executor: ExecutorName = Field("local", description="local (sandbox workers here) or ray.")
    address: str | None = Field(None, description="With --executor ray: the cluster to join (default: a local Ray).")
    workers: int = Field(1, ge=1, description="Evaluations at once (local sandbox workers, or Ray CPUs for a local Ray).")
    top: int = Field(3, ge=1, description="Cards taken from a capture target.")
    roofline_target: float = Field(1.0, gt=0, description="Stop a card when its best reaches this fraction of the roofline bound (bytes / DRAM copy bandwidth; cache-resident data can pass it).")
    patience: int = Field(2, ge=1, description="Prune a branch after this many results without improvement.")
    compile_baseline: bool = Field(False, description="Also time torch.compile when re-measuring the winners.")
    search_id: str | None = Field(None, description="Resume (or name) this search; default: the latest search of the same targets, provider and backend.")
    new: bool = Field(False, description="Start a new search even when one with the same targets exists.")


def optimize(req: OptimizeRequest, ctx: ToolContext) -> SearchResult:
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
        return run_search(repo, search, executor, ctx=ctx, progress=ctx.progress, resumed=resumed)
    finally:
        executor.close()


TOOL = register(
    Tool(
        name="optimize",
        request=OptimizeRequest,
        result=SearchResult,
        fn=optimize,
        summary="Search many candidate kernels for cards (or a capture's top cards) with a persistent tree search: "
        "UCT with progressive widening, children from a provider given the parent, its measurements and failed "
        "siblings; budgets in evaluations, time and money; resumable; evaluated by local sandbox workers or Ray "
        "tasks. Returns each card's best candidate re-measured against eager.",
    )
)
