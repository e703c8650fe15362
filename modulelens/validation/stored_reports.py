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


INTERRUPTED = "interrupted"


def is_complete(report: ValidationReport) -> bool:
    """Whether ``report`` is a verdict on the candidate: every report but that of a validation its
    caller cancelled (flagged ``interrupted``), which says nothing about the candidate."""
    return INTERRUPTED not in report.flags


def latest_verdict(repo: Repository, candidate: Artifact) -> tuple[str, ValidationReport] | None:
    """(reference name:vN, report) of the candidate's most recent complete validation report; the
    most recent report when none is complete; None when it was never validated. A cancelled
    re-validation thus never replaces the verdict before it."""
    name = report_name(candidate)
    versions = repo.versions(REPORTS, name)
    newest: tuple[str, ValidationReport] | None = None
    for version in reversed(versions):
        art = repo.open(REPORTS, f"{name}:v{version}")
        report = ValidationReport.model_validate(art.read_json(REPORT_FILE))
        if is_complete(report):
            return art.ref, report
        newest = newest or (art.ref, report)
    return newest


def latest_report(repo: Repository, candidate: Artifact) -> ValidationReport | None:
    """The candidate's most recent complete validation report (see :func:`latest_verdict`), or
    None when it was never validated."""
    found = latest_verdict(repo, candidate)
    return found[1] if found else None
