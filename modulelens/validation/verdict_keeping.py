"""The bookkeeping both validators share: stages reached, checks made, and the rejection."""

from __future__ import annotations

from collections.abc import Callable

from modulelens.validation.report import Check, ValidationReport


class ReportKeeper:
    """Mixin of a validator that holds ``report`` (its :class:`ValidationReport`) and ``stage_cb``
    (called with each stage's name as the validation reaches it)."""

    report: ValidationReport
    stage_cb: Callable[[str], None]

    def stage(self, name: str) -> None:
        """Record and announce that the validation reached stage ``name``."""
        self.report.stage = name
        self.stage_cb(name)

    def check(self, name: str, passed: bool, detail: str = "") -> bool:
        """Record one check; returns ``passed``."""
        self.report.checks.append(Check(name=name, passed=passed, detail=detail))
        return passed

    def reject(self, reason: str) -> ValidationReport:
        """Make the report a rejection for ``reason`` and return it."""
        self.report.verdict = "rejected"
        self.report.correct = False
        self.report.reason = reason
        return self.report
