"""Finalists re-measured together: several validated candidates of one card timed against eager
in the same mirrored rounds (eager, c1, .., ck, ck, .., c1, eager), each in its own contained
process, so that their speedups come from the same conditions and can be ranked by their
intervals' lower bounds (optimize's final re-measurement). Runs in a validation worker.

Each finalist is loaded and called once on the card's first sample; its timed batches are checked
calls as in validation (:mod:`.timed`). A finalist that fails to load or run is left out with the
reason; one caught with wrong timed outputs ends the re-measurement (its reason names it).
"""

from __future__ import annotations

from pathlib import Path

from modulelens.device import require
from modulelens.errors import ModuleLensError
from modulelens.ops import open_card, resolve_op, sample_call
from modulelens.repo import Repository
from modulelens.timing import SpeedupMeasurement, measure_speedups, thread_choice
from modulelens.validation.candidate_messages import LoadOpRequest, LoadRequest
from modulelens.validation.card import _Validator
from modulelens.validation.checker import CandidateFailed, start_candidate
from modulelens.validation.inputs import tensors
from modulelens.validation.messages import RemeasuredResult, RemeasureTask, ValidateCardTask
from modulelens.validation.timed import (
    ReferenceFailed,
    TimedProcess,
    TimingFeed,
    retained_calls,
    settle_verification,
    timing_plan,
)


def _load(checker: _Validator, shared: Path, args: list, kwargs: dict, want: list) -> str | None:
    """Load and call a finalist once; None when it runs, else why not."""
    cand = checker.task.candidate
    try:
        checker.get_ready(cand.backend)
        loaded = checker._request(LoadRequest(candidate=cand, build_dir=str(checker.proc.scratch / "build"),
                                              shared_build_dir=str(shared)), timeout=checker.task.build_timeout)
        if not loaded.ok:
            return f"does not compile: {loaded.error}"
        checker.call(args, kwargs, want, trace=False, label="the first sample")
    except CandidateFailed as e:
        return str(e)
    return None


def remeasure(task: RemeasureTask) -> RemeasuredResult:
    """The finalists' speedups over eager from one interleaved measurement (see the module docstring)."""
    art, card = open_card(Repository(task.repo), task.card_id)
    device = require(task.device or card.device)
    args, kwargs, _, _ = sample_call(art, card, 0, device=device)
    op = resolve_op(card.op)
    inplace = op._schema.name.endswith("_") or any(a.alias_info is not None and a.alias_info.is_write
                                                    for a in op._schema.arguments)
    want = tensors(op(*args, **kwargs))
    shared = Path(task.build_dir)
    threads = thread_choice()
    checkers: list[_Validator] = []
    reference = None
    try:
        for src in task.candidates:
            settings = ValidateCardTask(repo=task.repo, candidate=src, build_dir=task.build_dir, card_id=task.card_id,
                                        device=device, time=False, memory_limit_mb=task.memory_limit_mb,
                                        call_timeout=task.call_timeout, build_timeout=task.build_timeout)
            checker = _Validator(settings, lambda _: None)
            checker.threads = threads
            checker.proc = start_candidate(task.memory_limit_mb, read_only=[shared])
            checkers.append(checker)
        reference = start_candidate(task.memory_limit_mb, read_only=[shared])
        feed = TimingFeed(args, kwargs)
        reasons = [_load(c, shared, args, kwargs, want) or "" for c in checkers]
        sides = [TimedProcess(c, c.proc, f"finalist {i} ({c.task.candidate.provider})", device, feed, want,
                              verify=None if inplace else c._verify_timed(op))
                 for i, c in enumerate(checkers) if not reasons[i]]
        if not sides:
            return RemeasuredResult(measurements=[None] * len(checkers), reasons=reasons)
        load = LoadOpRequest(op=card.op, positional=len(args), kw_names=list(kwargs))
        eager = checkers[0]._reference_side(reference, load, "eager", device, feed, want, args, kwargs)
        plan = timing_plan(task.min_run_time, task.timing_budget_s, task.target_width)
        plan = plan.model_copy(update={"max_calls": retained_calls(want, plan.max_calls)})
        got = iter(measure_speedups(eager, sides, plan, threads))
        for side in sides:
            settle_verification(side)
        measurements: list[SpeedupMeasurement | None] = [None if r else next(got) for r in reasons]
        return RemeasuredResult(measurements=measurements, reasons=reasons)
    except (CandidateFailed, ReferenceFailed) as e:
        return RemeasuredResult(measurements=[None] * len(task.candidates), reasons=[str(e)] * len(task.candidates))
    except ModuleLensError as e:
        return RemeasuredResult(measurements=[None] * len(task.candidates), reasons=[str(e)] * len(task.candidates))
    finally:
        for c in checkers:
            c.proc.remove()
        if reference is not None:
            reference.remove()
