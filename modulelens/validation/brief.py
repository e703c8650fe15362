"""A validation report cut to the size of a reply an agent reads (within 8,000 characters with
the rest of the reply): what ``validate_kernel``, ``show candidate`` and ``show report`` return.
The stored report has it all; each cut is a :class:`~modulelens.listing.LeftOut` naming it."""

from __future__ import annotations

from typing import TypeVar

from modulelens.listing import LeftOut
from modulelens.validation.report import ValidationReport

__all__ = ["EDGE_CASES_SHOWN", "PASSED_DETAIL_CHARS", "brief_report"]

EDGE_CASES_SHOWN = 0  # edge cases listed by name in a reply (left_out counts them); a failing one is named in its check
PASSED_DETAIL_CHARS = 160  # a passed check's detail in a reply; the stored report has it whole

R = TypeVar("R", bound=ValidationReport)


def brief_report(report: R, limit: int, full: str, prefix: str = "",
                 budget: int | None = None) -> tuple[R, list[LeftOut]]:
    """``report`` cut for a reply, and what was cut (fields named with ``prefix``, e.g.
    ``report.`` for a report held in a field): its failed checks first, then the passed ones,
    ``limit`` in all, passed checks' detail cut to ``PASSED_DETAIL_CHARS``; the first
    ``EDGE_CASES_SHOWN`` edge cases (a failing one is named in its check); only the isolation layers
    that were *not* in force keep their detail (what is missing and why); the standing text on what
    the wrapper decision can and cannot see left out. With ``budget`` (characters of the report's
    compact JSON, the reply's other fields included when ``report`` is the reply), passed checks
    are dropped from the end until it fits (a validation under load notes more). ``full`` is the
    stored report, which has it all."""
    checks = [c if not c.passed or len(c.detail) <= PASSED_DETAIL_CHARS
              else c.model_copy(update={"detail": c.detail[:PASSED_DETAIL_CHARS - 1] + "…"})
              for c in sorted(report.checks, key=lambda c: c.passed)]  # stable: each group keeps its order
    update: dict = {}
    cut: list[LeftOut] = []
    if len(report.edge_cases) > EDGE_CASES_SHOWN:
        update["edge_cases"] = report.edge_cases[:EDGE_CASES_SHOWN]
        cut.append(LeftOut(field=f"{prefix}edge_cases", shown=EDGE_CASES_SHOWN, total=len(report.edge_cases), full=full))
    if report.wrapper_evidence:
        update["wrapper_evidence"] = ""
        cut.append(LeftOut(field=f"{prefix}wrapper_evidence", shown=0, total=1, full=full))
    if report.isolation is not None and any(x.detail for x in report.isolation.layers if x.in_force):
        layers = [x if not x.in_force else x.model_copy(update={"detail": ""}) for x in report.isolation.layers]
        update["isolation"] = report.isolation.model_copy(update={"layers": layers})
        cut.append(LeftOut(field=f"{prefix}isolation.layers.detail", shown=sum(1 for x in layers if x.detail),
                           total=len(layers), full=full))
    kept = checks[:limit]
    brief = report.model_copy(update={**update, "checks": kept})
    if budget is not None:
        # room for the left_out entries the reply gets (the one for checks included) and argument markers
        allowance = budget - 200 - sum(len(c.model_dump_json()) + 1 for c in cut) - (len(full) + 80)
        while kept and kept[-1].passed and len(brief.model_dump_json()) > allowance:
            kept = kept[:-1]
            brief = brief.model_copy(update={"checks": kept})
    if len(kept) < len(checks):
        cut.insert(0, LeftOut(field=f"{prefix}checks", shown=len(kept), total=len(checks), full=full))
    return brief, cut
