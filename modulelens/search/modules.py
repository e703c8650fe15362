"""The module level of optimize: for a capture target, ``ModelNew`` candidates for the captured
module itself, beside the search over its top cards.

Children of the module level: with the template provider, each variant of a module template that
fits the module (:mod:`modulelens.kernels.module_templates` for a pointwise chain, else
:mod:`modulelens.kernels.fusion_template` for a block whose pointwise and normalisation segments
between library calls can be fused; at most ``max_evals`` of them, each
evaluated once: a rerun finds them stored and reuses their reports). With an LLM provider
(``anthropic``, ``sampling``), ``ModelNew`` sources written from the capture
(:mod:`modulelens.providers.module_request`): the first a fresh one; then a child of the best
correct candidate (an improvement, told the errors of that candidate's failed children) or, while
none is correct, of the latest failed one (a repair, given its source and validation report), as
card children are. At most ``max_evals`` per run, stopping after ``patience`` children in a row
that did not improve the level's best, or when the search's ``max_cost`` is spent. Every module
candidate already validated against the capture counts too: an agent's, added with
``validate_kernel --source FILE --target CAPTURE``. The fastest correct module candidate is the level's winner;
``pack_candidates`` of the result pairs it with the cards' winners (in a pack, a module entry and
the operator entries inside it never both fire on one call).

Module candidates are validated in this process's sandbox pool, one at a time (the Ray executor
evaluates the cards only).
"""

from __future__ import annotations

from typing import Any

from modulelens.callbacks import ProgressFn
from modulelens.errors import ModuleLensError
from modulelens.repo import Artifact, Repository
from modulelens.search.model import ModuleNode, ModuleOutcome, SearchSettings
from modulelens.validation import ValidationReport, latest_report

MAX_SIBLING_ERRORS = 3


def _no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    pass


def _module_candidates(repo: Repository, capture: Artifact) -> list[tuple[Artifact, Any]]:
    """(candidate, its module candidate) of every module candidate stored for ``capture``."""
    from modulelens.kernels import CANDIDATES, load_module_candidate, module_candidate_name

    name = module_candidate_name(capture)
    out = []
    for v in repo.versions(CANDIDATES, name):
        art, cand, target = load_module_candidate(repo, f"{name}:v{v}")
        if target.capture == capture.ref:
            out.append((art, cand))
    return out


def _template_sources(capture: Artifact) -> tuple[list[tuple[str, str, int]], str | None]:
    """The module template sources for the captured module, as (source, family, variant): the
    pointwise-chain family when the module is one chain, else the fusing family
    (:mod:`modulelens.kernels.fusion_template`: library calls kept, the segments between them
    fused); or none, with why neither fits (the note names both reasons)."""
    from modulelens.capture import LoadedCapture
    from modulelens.kernels import (
        FUSION_TEMPLATE_FAMILY,
        FUSION_TEMPLATE_VARIANTS,
        NotFusable,
        fusion_plan,
        pointwise_chain,
        render_fused,
        render_pointwise,
    )
    from modulelens.kernels import MODULE_TEMPLATE_FAMILY as FAMILY
    from modulelens.kernels import MODULE_TEMPLATE_VARIANTS as VARIANTS

    loaded = LoadedCapture(capture)
    args, kwargs = loaded.inputs()
    try:
        module, _, _, _ = loaded.with_strategy("auto", False, lambda m: m)
    except ModuleLensError as e:
        return [], f"the module could not be rebuilt to match a template: {e.message}"
    try:
        chain = pointwise_chain(module, args, kwargs)
        return [(render_pointwise(chain, v), FAMILY, v) for v in range(len(VARIANTS))], None
    except NotFusable as e:
        chain_why = str(e)
    try:
        plan = fusion_plan(module, args, kwargs)
    except NotFusable as e:
        return [], f"no module template fits: not a pointwise chain ({chain_why}); not fusable ({e})"
    return ([(render_fused(plan, v), FUSION_TEMPLATE_FAMILY, v) for v in range(len(FUSION_TEMPLATE_VARIANTS))],
            f"{FUSION_TEMPLATE_FAMILY}: {plan.summary()}")


def _rank(report: ValidationReport | None) -> float | None:
    """The lower bound of a correct candidate's speedup interval (what the winner is chosen by), or
    None for one that failed, was not timed, is undetermined or was flagged."""
    if report is None or not report.correct or report.verdict == "rejected":
        return None
    if report.speedup_vs_eager is None or not report.speedup_interval or any(f.startswith("suspicious") for f in report.flags):
        return None
    return report.speedup_interval[0]


def _best(reports: dict[str, ValidationReport | None]) -> tuple[float, str] | None:
    ranked = [(low, ref) for ref, r in reports.items() if (low := _rank(r)) is not None]
    return max(ranked) if ranked else None


def _parent(stored: list[tuple[Artifact, Any]], reports: dict[str, ValidationReport | None]) -> Artifact | None:
    """The candidate the next LLM child builds on: the best correct one, else the latest failed one."""
    best = _best(reports)
    if best is not None:
        return next(art for art, _ in stored if art.ref == best[1])
    validated = [(art, r) for art, _ in stored if (r := reports.get(art.ref)) is not None]
    correct = [art for art, r in validated if r.correct]
    return (correct or [art for art, _ in validated] or [None])[-1]


def _child_request(base: Any, stored: list[tuple[Artifact, Any]], reports: dict[str, ValidationReport | None]) -> Any:
    """The request for the next child: ``base`` with the parent, its report, and the errors of the
    parent's failed children (so a child does not repeat them)."""
    parent = _parent(stored, reports)
    children = [(art, cand) for art, cand in stored
                if cand.provenance.get("parent") == (parent.ref if parent else None) and reports.get(art.ref)]
    if parent is None:
        return base.model_copy(update={"variant": len(children)})
    cand = next(c for art, c in stored if art is parent)
    failed = [reports[art.ref] for art, _ in children if not reports[art.ref].correct][-MAX_SIBLING_ERRORS:]
    lines = [f"- {r.reason}: {(r.errors or [''])[0][:500]}" for r in failed]
    instructions = ("Earlier children of this version failed; do not repeat these errors:\n" + "\n".join(lines)
                    if lines else None)
    return base.model_copy(update={"parent": cand, "parent_ref": parent.ref, "variant": len(children),
                                   "parent_report": reports[parent.ref].model_dump(mode="json"),
                                   "instructions": instructions})


def _search_spend(stored: list[tuple[Artifact, Any]], search_id: str | None) -> float:
    return sum(float(c.provenance.get("cost_usd") or 0.0) for _, c in stored
               if search_id is not None and c.provenance.get("search") == search_id)


def _llm_children(repo: Repository, capture: Artifact, target: Any, settings: SearchSettings,
                  stored: list[tuple[Artifact, Any]], outcome: ModuleOutcome, *, ctx: Any, provider: Any,
                  search_id: str | None, spent_usd: float, progress: ProgressFn) -> None:
    """Ask the LLM provider for ModelNew children and validate each (see the module docstring)."""
    from modulelens.kernels import save_module_candidate
    from modulelens.providers.base import ModuleProvider, get_provider
    from modulelens.providers.module_request import describe_capture
    from modulelens.validation import validate_stored_module

    provider = provider or get_provider(settings.provider)
    if not isinstance(provider, ModuleProvider):
        outcome.template_note = (f"the {provider.name} provider writes card kernels only; module candidates come "
                                 f"from validate_kernel of a ModelNew (source: its file, target: {capture.ref})")
        return
    base = describe_capture(capture)
    reports = {art.ref: latest_report(repo, art) for art, _ in stored}
    known = {cand.sha256 for _, cand in stored}
    outcome.cost_usd = _search_spend(stored, search_id)
    stale = 0
    while outcome.evaluations < settings.max_evals and stale < settings.patience:
        if settings.max_cost_usd is not None and spent_usd + outcome.cost_usd >= settings.max_cost_usd:
            outcome.stopped_because = "max_cost"
            break
        req = _child_request(base, stored, reports)
        progress(outcome.evaluations, settings.max_evals, f"module level: asking the {provider.name} provider for a "
                 + (f"child of {req.parent_ref}" if req.parent_ref else "ModelNew"))
        try:
            cand = provider.generate_module(req, ctx)
        except ModuleLensError as e:
            outcome.stopped_because = f"the {provider.name} provider wrote no ModelNew: {e.message}"
            break
        cand.provenance.update(search=search_id, parent=req.parent_ref)
        outcome.cost_usd += float(cand.provenance.get("cost_usd") or 0.0)
        if cand.sha256 in known:  # the provider repeated itself: nothing new to validate
            stale += 1
            continue
        before = _best(reports)
        art = save_module_candidate(repo, target, capture, cand)
        progress(outcome.evaluations, settings.max_evals, f"module level: validating {art.ref}")
        reports[art.ref] = validate_stored_module(repo, art, cand, target, seeds=settings.seeds,
                                                  timeout=settings.timeout_s)[0]
        stored.append((art, cand))
        known.add(cand.sha256)
        outcome.evaluations += 1
        after = _best(reports)
        improved = after is not None and (before is None or after[0] > before[0] * (1 + settings.min_improvement))
        stale = 0 if improved else stale + 1
    if outcome.stopped_because is None and stale >= settings.patience:
        outcome.stopped_because = f"{stale} children in a row did not improve the module level's best"
    outcome.template_note = f"{outcome.evaluations} ModelNew child(ren) from the {provider.name} provider this run"


def search_module(repo: Repository, capture_ref: str, settings: SearchSettings,
                  progress: ProgressFn = _no_progress, *, ctx: Any = None, provider: Any = None,
                  search_id: str | None = None, spent_usd: float = 0.0) -> ModuleOutcome:
    """The module level of a search for the capture ``capture_ref`` (see the module docstring).
    ``ctx`` is the tool context (the sampling provider asks the MCP client through it);
    ``provider`` overrides the provider named in the settings (tests drive fakes through it);
    ``search_id`` marks the LLM children (their spend counts to that search's ``max_cost``);
    ``spent_usd`` is what the rest of the search has spent."""
    from modulelens.capture import KIND as CAPTURES
    from modulelens.capture import capture_manifest
    from modulelens.kernels import ModuleCandidate, ModuleTarget, save_module_candidate
    from modulelens.validation import validate_stored_module

    capture = repo.open(CAPTURES, capture_ref)
    manifest = capture_manifest(capture)
    target = ModuleTarget(capture=capture.ref, class_path=manifest.class_path, module_path=manifest.module_path)
    outcome = ModuleOutcome(capture=capture.ref, class_path=manifest.class_path)
    stored = _module_candidates(repo, capture)
    known = {cand.sha256 for _, cand in stored}
    if settings.provider == "template" and provider is None:
        sources, outcome.template_note = _template_sources(capture)
        for i, (source, family, variant) in enumerate(sources[:settings.max_evals]):
            cand = ModuleCandidate(source=source, claims_training=manifest.training, provider="template",
                                   provenance={"template": family, "variant": variant})
            if cand.sha256 in known:
                continue
            art = save_module_candidate(repo, target, capture, cand)
            progress(i, len(sources), f"module level: validating {art.ref} ({family} variant {variant})")
            validate_stored_module(repo, art, cand, target, seeds=settings.seeds, timeout=settings.timeout_s)
            stored.append((art, cand))
            outcome.evaluations += 1
    else:
        _llm_children(repo, capture, target, settings, stored, outcome, ctx=ctx, provider=provider,
                      search_id=search_id, spent_usd=spent_usd, progress=progress)
    reports = {art.ref: latest_report(repo, art) for art, _ in stored}
    for art, cand in stored:
        report = reports[art.ref]
        if report is not None:
            outcome.nodes.append(ModuleNode(candidate=art.ref, parent=cand.provenance.get("parent"),
                                            provider=cand.provider, verdict=report.verdict, correct=report.correct,
                                            reason=report.reason, speedup_vs_eager=report.speedup_vs_eager))
    best = _best(reports)
    if best is not None:
        outcome.best_candidate = best[1]
        report = reports[best[1]]
        outcome.speedup_vs_eager, outcome.speedup_interval = report.speedup_vs_eager, report.speedup_interval
    return outcome
