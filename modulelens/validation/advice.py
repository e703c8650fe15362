"""What a validation report means for the one who reads it: the warnings an agent must not miss
(flags, timings not determined, code that never ran, protection not in force, a wrapper or a
slowdown) and the calls that usually follow (repair, pack)."""

from __future__ import annotations

from modulelens.replies import NextCall, call
from modulelens.timing import surely_above_one
from modulelens.validation.report import ValidationReport


def report_warnings(report: ValidationReport) -> list[str]:
    """The warnings of one validation report, most important first."""
    out = [f"flagged: {flag}" for flag in report.flags]
    if report.compiled and not report.ran:
        out.append("compiled only: the kernel never ran here, so it is not shown correct or fast")
    if report.correct and report.edge_cases_note:
        out.append(report.edge_cases_note.split(". Not run:")[0])
    if report.correct:
        out += _timing_warnings(report)
    if report.verdict == "wrapper" and report.backend_calls:
        out.append(f"a wrapper: it calls back into {', '.join(report.backend_calls[:3])} for the computation")
    elif report.verdict == "wrapper" and report.denial is not None:
        what = "not confirmed to compute by itself" if report.denial.outcome == "inconclusive" else "a wrapper"
        out.append(f"{what}: {report.denial.detail}")
    elif report.verdict == "wrapper":
        out.append("a wrapper: it calls back into torch for the computation")
    accepted = [a for a in report.accuracy if a.accepted and a.eager_max_abs is not None]
    if accepted:
        a = max(accepted, key=lambda x: x.eager_max_abs or 0.0)
        out.append(f"accepted against the float64 oracle: eager itself is off by up to {a.eager_max_abs:.3g} here "
                   f"(the candidate by {a.candidate_max_abs:.3g}; {a.case})")
    if report.isolation is not None:
        missing = [f"{x.name} ({_short(x.detail)})" if x.detail else x.name
                   for x in report.isolation.layers if not x.in_force]
        if missing:
            out.append(f"sandbox layers not in force: {'; '.join(missing)}")
    return out


def _short(text: str, limit: int = 240) -> str:
    """``text`` cut to ``limit`` characters: a layer's why and what to do, as a warning shows it."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _interval(interval: list[float] | None) -> str:
    return f"95% interval {interval[0]:.2f}x..{interval[1]:.2f}x" if interval else "no interval"


def _timing_warnings(report: ValidationReport) -> list[str]:
    """A correct candidate's speed: not timed, undetermined (the number is null), or not surely
    faster than eager (the lower bound of its interval at or below 1): a pack uses it only when
    that lower bound is above 1."""
    interval = report.speedup_interval
    if report.timing_status is None:
        return [f"not timed: {report.timing_note or 'timing was off'}; a pack will not use it until timed"]
    out = []
    if report.timing_status == "undetermined":
        said = "" if not interval or "interval" in report.timing_reason else f" ({_interval(interval)})"
        out.append(f"speed undetermined{said}: {report.timing_reason}; validate it again on a quieter machine")
    if not interval or interval[0] <= 1.0:
        out.append(f"not surely faster than eager ({_interval(interval)}): a pack will not use it")
    if report.compile_timing_status == "undetermined":
        out.append(f"speed against torch.compile undetermined: {report.compile_timing_reason}")
    return out


def surely_faster(report: ValidationReport) -> bool:
    """Correct and custom, with a speedup interval whose lower bound is above 1 (what a pack needs)."""
    return report.verdict == "custom" and report.correct and surely_above_one(report.speedup_interval)


def report_next(report: ValidationReport, candidate_id: str, target: str | None, source: str | None = None, *,
                provider: str = "agent", module: bool = False, timed: bool | None = None) -> list[NextCall]:
    """The call after a validation, at each fork (``target``: the card, or the capture of a module
    candidate; ``source``: the file the candidate came from, when it came from one; ``provider``:
    who wrote it, ``agent`` for code given by the caller):

    * surely faster than eager: pack it;
    * correct but not timed (``timed`` False: timing was off; None: unknown, taken as off when the
      report gives no reason it could not be timed), or its speed undetermined: validate the stored
      candidate again, timed; correct but not timeable here (a Triton kernel without a GPU): none;
    * rejected, a wrapper, or correct but not faster: the caller's own code (``agent``, and every
      module candidate) is fixed by the caller and validated again from its source (a provider's
      repair would replace it with that provider's code, so none is suggested); a provider's
      candidate is repaired or improved by the same provider, named, with it as parent, except a
      template rejected on an edge case (drawing it again is no fix: none is suggested).
    """
    if surely_faster(report):
        name = candidate_id.split(".", 1)[0]
        return [call("pack", candidates=[candidate_id], out=f"{name}.pack")]
    if report.correct and report.verdict == "custom" and report.timing_status != "ok":
        timing_was_off = timed is False or (timed is None and not report.timing_note)
        if report.timing_status == "undetermined" or timing_was_off:
            return [call("validate_kernel", candidate=candidate_id, time=True)]
        return []  # it cannot be timed here: nothing to do but use it where it can
    if not target:
        return []
    if module or provider == "agent":
        return [call("validate_kernel", source=source, target=target, backend=None if module else report.backend)]
    if provider == "template" and report.failed_edge_case:
        return []  # a template draws the same code again: no repair for the case that exposed it
    return [call("generate_kernel", card=target, parent=candidate_id, provider=provider, backend=report.backend)]
