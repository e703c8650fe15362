"""Read-only views of the candidates in a repository: one row per candidate with its latest
verdict, and one candidate in full (source, provenance and latest validation report), read
through :class:`~modulelens.kernels.candidates.CandidateManifest`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from modulelens.kernels import CANDIDATES, candidate_manifest, load_candidate
from modulelens.listing import LeftOut
from modulelens.ops import resolved_card_id
from modulelens.replies import ToolReply
from modulelens.repo import Artifact, Repository
from modulelens.validation.report import ValidationReport
from modulelens.validation.stored_reports import REPORT_FILE, REPORTS, ReportManifest, latest_report, report_name


class CandidateEntry(BaseModel):
    candidate_id: str = Field(description="name:vN of the candidate (use with validate-kernel).")
    card_id: str = Field(description="The operator card it implements.")
    op: str
    kind: str
    backend: str
    provider: str
    family: str | None = None
    parent: str | None = Field(None, description="The candidate it repairs or improves, if any.")
    created_at: str
    reports: int = Field(description="How many validations are stored.")
    report: str | None = Field(None, description="Reference of the latest validation report (None: not validated).")
    verdict: str | None = Field(None, description="custom, wrapper or rejected; None when never validated.")
    correct: bool | None = None
    reason: str | None = None
    speedup_vs_eager: float | None = None


def _entry(repo: Repository, art: Artifact) -> tuple[CandidateEntry, ValidationReport | None]:
    m = candidate_manifest(art)
    versions = repo.versions(REPORTS, report_name(art))
    report = latest_report(repo, art) if versions else None
    entry = CandidateEntry(
        candidate_id=art.ref, card_id=m.target.card_id, op=m.target.op, kind=m.target.kind, backend=m.backend,
        provider=m.provider, family=m.family, parent=m.parent, created_at=m.created_at, reports=len(versions),
        report=f"{report_name(art)}:v{versions[-1]}" if versions else None,
        verdict=report.verdict if report else None, correct=report.correct if report else None,
        reason=report.reason if report else None, speedup_vs_eager=report.speedup_vs_eager if report else None,
    )
    return entry, report


def candidate_entries(repo: Repository, card: str | None = None) -> list[CandidateEntry]:
    """Every candidate version, by name then version; only those for ``card`` when given (a card id
    such as ``blk/6``; its opset reference is resolved first)."""
    wanted = resolved_card_id(repo, card) if card else None
    out = []
    for name in repo.names(CANDIDATES):
        for version in repo.versions(CANDIDATES, name):
            entry, _ = _entry(repo, repo.open(CANDIDATES, f"{name}:v{version}"))
            if wanted is None or entry.card_id == wanted:
                out.append(entry)
    return out


class CandidateView(ToolReply):
    entry: CandidateEntry
    source: str = Field(description="The kernel source text.")
    source_path: str = Field(description="The source file in the repository.")
    entry_point: str
    params: dict[str, Any] = Field(default_factory=dict)
    provenance: dict[str, Any] = Field(default_factory=dict)
    report: ValidationReport | None = Field(None, description="The latest validation report in full.")
    left_out: list[LeftOut] = Field(default_factory=list, description="What was cut (source lines).")


def first_source_lines(view: CandidateView, lines: int | None) -> CandidateView:
    """``view`` with at most ``lines`` lines of its source (None: all); a cut is recorded in
    ``left_out`` with the source file, which has it all."""
    all_lines = view.source.splitlines(keepends=True)
    if lines is None or len(all_lines) <= lines:
        return view
    cut = LeftOut(field="source", shown=lines, total=len(all_lines), full=view.source_path)
    return view.model_copy(update={"source": "".join(all_lines[:lines]), "left_out": [*view.left_out, cut]})


def candidate_view(repo: Repository, candidate_id: str) -> CandidateView:
    """One candidate in full: its row, source (checked against its sha256) and latest report."""
    art, src = load_candidate(repo, candidate_id)
    entry, report = _entry(repo, art)
    source_file = candidate_manifest(art).source_file
    return CandidateView(entry=entry, source=src.source, source_path=str(art.file(source_file)),
                         entry_point=src.entry, params=src.params, provenance=src.provenance, report=report)


class ReportEntry(BaseModel):
    """One stored validation report, in a listing."""

    report: str = Field(description="name:vN of the report (show it with kind report).")
    candidate: str
    verdict: str
    correct: bool
    speedup_vs_eager: float | None = None
    created_at: str


def report_entries(repo: Repository, candidate: str | None = None) -> list[ReportEntry]:
    """Every stored validation report, by name then version; only those of ``candidate`` when given
    (a candidate id, resolved first)."""
    names = repo.names(REPORTS)
    if candidate:
        names = [report_name(repo.open(CANDIDATES, candidate))]
    out = []
    for name in names:
        for version in repo.versions(REPORTS, name):
            m = repo.open(REPORTS, f"{name}:v{version}").manifest_as(ReportManifest)
            out.append(ReportEntry(report=f"{name}:v{version}", candidate=m.candidate, verdict=m.verdict,
                                   correct=m.correct, speedup_vs_eager=m.speedup_vs_eager, created_at=m.created_at))
    return out


def stored_report(repo: Repository, ref: str) -> tuple[str, ValidationReport]:
    """The reference (name:vN) and content of the stored validation report ``ref``."""
    art = repo.open(REPORTS, ref)
    return art.ref, ValidationReport.model_validate(art.read_json(REPORT_FILE))
