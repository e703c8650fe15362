"""What a validation report means for the one who reads it: the warnings an agent must not miss
(flags, timings not determined, code that never ran, protection not in force, a wrapper or a
slowdown) and the calls that usually follow (repair, pack)."""

from __future__ import annotations

from modulelens.replies import NextCall, call
from modulelens.validation.report import ValidationReport


def report_warnings(report: ValidationReport) -> list[str]:
    """The warnings of one validation report, most important first."""
    out = [f"flagged: {flag}" for flag in report.flags]
    if report.compiled and not report.ran:
        out.append("compiled only: the kernel never ran here, so it is not shown correct or fast")
    if report.correct and report.speedup_vs_eager is None:
        out.append(f"speed undetermined: {report.timing_note or 'not timed'}; a pack will not use it until timed")
    elif report.correct and report.speedup_vs_eager is not None and report.speedup_vs_eager <= 1.0:
        out.append(f"slower than eager ({report.speedup_vs_eager:.2f}x): a pack will not use it")
    if report.verdict == "wrapper":
        calls = ", ".join(report.backend_calls[:3]) or "torch"
        out.append(f"a wrapper: it calls back into {calls} for the computation")
    if report.isolation is not None:
        missing = [layer.name for layer in report.isolation.layers if not layer.in_force]
        if missing:
            out.append(f"sandbox layers not in force: {', '.join(missing)}")
    return out


def report_next(report: ValidationReport, candidate_id: str, card_id: str | None) -> list[NextCall]:
    """The calls after a validation: a repair when rejected, a pack when it is a usable kernel."""
    if report.verdict == "rejected" and card_id:
        return [call("generate_kernel", card=card_id, parent=candidate_id)]
    if report.verdict == "custom" and report.correct and (report.speedup_vs_eager or 0) > 1.0:
        name = candidate_id.split(".", 1)[0]
        return [call("pack", candidates=[candidate_id], out=f"{name}.pack")]
    return []
