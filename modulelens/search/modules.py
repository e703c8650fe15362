"""The module level of optimize: for a capture target, ``ModelNew`` candidates for the captured
module itself, beside the search over its top cards.

Children of the module level: each variant of a module template that fits the module
(:mod:`modulelens.kernels.module_templates`; at most ``max_evals`` of them, each evaluated once:
a rerun finds them stored and reuses their reports), and every module candidate already validated
against the capture: an agent's or an LLM's, added with ``validate_kernel --source FILE --target CAPTURE``. The
LLM providers do not write module candidates here (yet): with them, the module level takes the
agent's children only, and says so. The fastest correct module candidate is the level's winner;
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
from modulelens.search.model import ModuleOutcome, SearchSettings


def _no_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    pass


def _module_candidates(repo: Repository, capture: Artifact) -> list[tuple[Artifact, Any]]:
    """(candidate, its module candidate) of every module candidate stored for ``capture``."""
    from modulelens.kernels.candidates import CANDIDATES
    from modulelens.kernels.module_candidates import load_module_candidate, module_candidate_name

    name = module_candidate_name(capture)
    out = []
    for v in repo.versions(CANDIDATES, name):
        art, cand, target = load_module_candidate(repo, f"{name}:v{v}")
        if target.capture == capture.ref:
            out.append((art, cand))
    return out


def _template_sources(capture: Artifact) -> tuple[list[str], str | None]:
    """The module template sources for the captured module (one per variant), or why none fits."""
    from modulelens.capture.replay import LoadedCapture
    from modulelens.kernels.module_templates import VARIANTS, NotFusable, pointwise_chain, render_pointwise

    loaded = LoadedCapture(capture)
    args, kwargs = loaded.inputs()
    try:
        module, _, _, _ = loaded.with_strategy("auto", False, lambda m: m)
        chain = pointwise_chain(module, args, kwargs)
    except NotFusable as e:
        return [], f"no module template fits: {e}"
    except ModuleLensError as e:
        return [], f"the module could not be rebuilt to match a template: {e.message}"
    return [render_pointwise(chain, v) for v in range(len(VARIANTS))], None


def search_module(repo: Repository, capture_ref: str, settings: SearchSettings,
                  progress: ProgressFn = _no_progress) -> ModuleOutcome:
    """The module level of a search for the capture ``capture_ref`` (see the module docstring)."""
    from modulelens.capture.manifest import KIND as CAPTURES
    from modulelens.capture.manifest import capture_manifest
    from modulelens.kernels.module_candidates import ModuleCandidate, ModuleTarget, save_module_candidate
    from modulelens.kernels.module_templates import FAMILY
    from modulelens.validation.module_runs import validate_stored_module
    from modulelens.validation.stored_reports import latest_report

    capture = repo.open(CAPTURES, capture_ref)
    manifest = capture_manifest(capture)
    target = ModuleTarget(capture=capture.ref, class_path=manifest.class_path, module_path=manifest.module_path)
    outcome = ModuleOutcome(capture=capture.ref, class_path=manifest.class_path)
    stored = _module_candidates(repo, capture)
    known = {cand.sha256 for _, cand in stored}
    if settings.provider == "template":
        sources, outcome.template_note = _template_sources(capture)
        for variant, source in enumerate(sources[:settings.max_evals]):
            cand = ModuleCandidate(source=source, claims_training=manifest.training, provider="template",
                                   provenance={"template": FAMILY, "variant": variant})
            if cand.sha256 in known:
                continue
            art = save_module_candidate(repo, target, capture, cand)
            progress(variant, len(sources), f"module level: validating {art.ref} ({FAMILY} variant {variant})")
            validate_stored_module(repo, art, cand, target, seeds=settings.seeds, timeout=settings.timeout_s)
            stored.append((art, cand))
            outcome.evaluations += 1
    else:
        outcome.template_note = (f"the {settings.provider} provider writes card kernels only; module candidates come "
                                 f"from validate_kernel of a ModelNew (source: its file, target: {capture.ref})")
    best: tuple[float, str, Any] | None = None
    for art, _ in stored:
        report = latest_report(repo, art)
        if report is None:
            continue
        outcome.candidates.append(art.ref)
        # ranked by the lower bound of the speedup's interval; never an undetermined or flagged one
        determined = report.speedup_vs_eager is not None and report.speedup_interval
        flagged = any(f.startswith("suspicious") for f in report.flags)
        if report.correct and report.verdict != "rejected" and determined and not flagged:
            low = report.speedup_interval[0]
            if best is None or low > best[0]:
                best = (low, art.ref, report)
    if best is not None:
        _, outcome.best_candidate, report = best
        outcome.speedup_vs_eager, outcome.speedup_interval = report.speedup_vs_eager, report.speedup_interval
    return outcome
