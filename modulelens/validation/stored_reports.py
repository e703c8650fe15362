"""Validation reports in the repository: each validation of candidate ``blk.card6:vN`` is a
version of ``reports/blk.card6.vN``, its manifest a :class:`ReportManifest` (nothing reads it by
string key) and the full :class:`~modulelens.validation.report.ValidationReport` in ``report.json``.
"""

from __future__ import annotations

from pathlib import Path

from modulelens.repo import Artifact, ManifestBase, Repository
from modulelens.validation.report import ModuleValidationSettings, ValidationReport, ValidationSettings

REPORTS = "reports"
REPORT_FILE = "report.json"


class ReportManifest(ManifestBase):
    """The manifest of a ``reports`` artifact; the full report is in ``report.json``."""

    candidate: str
    verdict: str
    correct: bool
    speedup_vs_eager: float | None = None
    settings: ValidationSettings | ModuleValidationSettings


def report_name(candidate: Artifact) -> str:
    return f"{candidate.name}.v{candidate.version}"


def save_report(repo: Repository, candidate: Artifact, report: ValidationReport,
                settings: ValidationSettings | ModuleValidationSettings) -> Artifact:
    """Store a validation of ``candidate`` as a new version of its report."""
    def write(folder: Path) -> ReportManifest:
        (folder / REPORT_FILE).write_text(report.model_dump_json(indent=2))
        return ReportManifest(candidate=candidate.ref, verdict=report.verdict, correct=report.correct,
                              speedup_vs_eager=report.speedup_vs_eager, settings=settings)

    return repo.create(REPORTS, report_name(candidate), write)


def latest_report(repo: Repository, candidate: Artifact) -> ValidationReport | None:
    """The candidate's most recent validation report, or None when it was never validated."""
    name = report_name(candidate)
    if not repo.versions(REPORTS, name):
        return None
    art = repo.open(REPORTS, name)
    return ValidationReport.model_validate(art.read_json(REPORT_FILE))
