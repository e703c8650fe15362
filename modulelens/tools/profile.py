"""profile: time a capture, an operator card or a candidate fairly and explain every number.

Captures and cards are timed here (:mod:`modulelens.profiling`); candidates are untrusted code,
timed only in a sandbox worker (:func:`modulelens.validation.sandboxed.time_candidate`).
"""

from __future__ import annotations

from pydantic import Field

from modulelens.callbacks import ProgressFn
from modulelens.device import require
from modulelens.errors import InvalidName
from modulelens.kernels import CANDIDATES, candidate_manifest, load_candidate
from modulelens.listing import MAX_ITEMS, keep_first
from modulelens.ops import is_card_id, open_card
from modulelens.profiling.targets import ProfileOptions, ProfileResult, add_roofline, profile_target
from modulelens.registry import ToolContext, tool
from modulelens.replies import call
from modulelens.repo import Repository, parse_ref
from modulelens.validation import time_candidate


class ProfileRequest(ProfileOptions):
    target: str = Field(description="Its ref or id.",
                        json_schema_extra={"cli": "argument"})
    limit: int = Field(10, ge=1, le=MAX_ITEMS, description="Entries listed.")


@tool
def profile(req: ProfileRequest, ctx: ToolContext) -> ProfileResult:
    """Time a capture, card or candidate (median, p20/p80; profiler breakdown)."""
    if req.device is not None:
        require(req.device)
    repo = Repository(ctx.repo_root)
    if not is_card_id(req.target) and _is_candidate(repo, req.target):
        result = profile_candidate(repo, req.target, req, ctx.progress)
    else:
        result = profile_target(repo, req.target, req, ctx.progress)
    if result.runs < 10 or (result.median_s and (result.p80_s - result.p20_s) > result.median_s):
        result.warnings.append(f"a noisy or short measurement ({result.runs} runs, p20-p80 {result.p20_s:.3g}-"
                               f"{result.p80_s:.3g} s): compare speeds only with a longer [--min-run-time]")
    result.warnings += [n for n in result.notes if "synthes" in n or "not comparable" in n]
    if result.target_kind == "card":
        result.next = [call("generate_kernel", card=result.target)]
    return keep_breakdown(result, req.limit)


def profile_candidate(repo: Repository, candidate_id: str, options: ProfileOptions,
                      progress: ProgressFn) -> ProfileResult:
    """Candidates are untrusted code: they are timed inside the sandbox, never in this process."""
    art, src = load_candidate(repo, candidate_id)
    card_id = candidate_manifest(art).target.card_id
    progress(0, 1, f"timing {art.ref} in the sandbox")
    timing = time_candidate(repo, art, src, device=options.device, min_run_time=options.min_run_time,
                            warmup=options.warmup)
    _, card = open_card(repo, card_id)
    notes = ["timed in the sandbox worker; run profile on the card for the eager operator's breakdown"]
    result = ProfileResult(**timing.model_dump(), target=art.ref, target_kind="candidate",
                           what=f"one call of candidate {art.ref} ({src.backend}) on card {card_id}'s first sample",
                           grad_enabled=False, notes=notes)
    if card.kind == "memory" and card.bytes_per_call:
        add_roofline(result, card, timing.device)
    progress(1, 1, "done")
    return result


def _is_candidate(repo: Repository, target: str) -> bool:
    try:
        return bool(repo.versions(CANDIDATES, parse_ref(target).name))
    except InvalidName:
        return False


def keep_breakdown(result: ProfileResult, limit: int | None) -> ProfileResult:
    """``result`` with the ``limit`` operators of its breakdown that took the most time (None: all)."""
    if result.breakdown is None:
        return result
    return keep_first(result, "breakdown", limit, "profile again with a larger [--limit N]")


