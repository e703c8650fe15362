"""Read-only views of the candidates in a repository: one row per candidate with its latest
complete verdict, and one candidate in full (source, provenance and that report).

The catalog is typed: a candidate is a ``card`` candidate (a kernel for an operator card, read
through :class:`~modulelens.kernels.candidates.CandidateManifest`) or a ``module`` candidate (a
``ModelNew`` for a captured module, read through
:class:`~modulelens.kernels.module_candidates.ModuleCandidateManifest`); each row says which in
``kind``. A stored candidate whose manifest cannot be read is listed as ``broken`` with what is
wrong, so that one bad folder never hides the others.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError
from modulelens.kernels import (
    CANDIDATES,
    ModuleCandidateManifest,
    candidate_manifest,
    is_module_candidate,
    load_candidate,
    load_module_candidate,
)
from modulelens.listing import LeftOut
from modulelens.ops import resolved_card_id
from modulelens.replies import ToolReply
from modulelens.repo import Artifact, Repository
from modulelens.validation.report import ValidationReport
from modulelens.validation.stored_reports import REPORT_FILE, REPORTS, ReportManifest, latest_verdict, report_name

CandidateKind = Literal["card", "module", "broken"]


class CandidateEntry(BaseModel):
    candidate_id: str = Field(description="name:vN of the candidate (use with validate_kernel).")
    kind: CandidateKind = Field(description="card: a kernel for one operator card; module: a ModelNew replacing a "
                                "whole captured module; broken: its stored files cannot be read (see problem).")
    target: str = Field(description="What it replaces: the card id (card) or the capture ref (module).")
    card_id: str | None = Field(None, description="card candidates: the operator card it implements.")
    op: str | None = Field(None, description="card: the operator; module: the class path of the captured module.")
    op_kind: str | None = Field(None, description="card candidates: memory, compute or view.")
    backend: str | None = None
    provider: str | None = None
    family: str | None = None
    parent: str | None = Field(None, description="The candidate it repairs or improves, if any.")
    created_at: str | None = None
    problem: str | None = Field(None, description="broken: what is wrong with its stored files.")
    reports: int = Field(0, description="How many validations are stored (interrupted ones included).")
    report: str | None = Field(None, description="Reference of the report its verdict comes from: the latest "
                               "complete validation (None: not validated).")
    verdict: str | None = Field(None, description="custom, wrapper or rejected; None when never validated.")
    correct: bool | None = None
    reason: str | None = None
    speedup_vs_eager: float | None = None
    timing_status: str | None = None


def _described(repo: Repository, art: Artifact) -> CandidateEntry:
    """The row of ``art`` without its verdict: by its kind, read through that kind's manifest."""
    if is_module_candidate(art):
        mm = art.manifest_as(ModuleCandidateManifest)
        return CandidateEntry(candidate_id=art.ref, kind="module", target=mm.target.capture, op=mm.target.class_path,
                              backend=mm.backend, provider=mm.provider, created_at=mm.created_at)
    m = candidate_manifest(art)
    return CandidateEntry(candidate_id=art.ref, kind="card", target=m.target.card_id, card_id=m.target.card_id,
                          op=m.target.op, op_kind=m.target.kind, backend=m.backend, provider=m.provider,
                          family=m.family, parent=m.parent, created_at=m.created_at)


def _entry(repo: Repository, art: Artifact) -> tuple[CandidateEntry, ValidationReport | None]:
    entry = _described(repo, art)
    found = latest_verdict(repo, art)
    entry.reports = len(repo.versions(REPORTS, report_name(art)))
    if found is None:
        return entry, None
    entry.report, report = found
    entry.verdict, entry.correct, entry.reason = report.verdict, report.correct, report.reason
    entry.speedup_vs_eager, entry.timing_status = report.speedup_vs_eager, report.timing_status
    return entry, report


def _broken(ref: str, error: ModuleLensError) -> CandidateEntry:
    return CandidateEntry(candidate_id=ref, kind="broken", target="", problem=str(error))


def candidate_entries(repo: Repository, of: str | None = None) -> list[CandidateEntry]:
    """Every candidate version, card and module candidates alike, by name then version; a stored
    candidate that cannot be read is a ``broken`` row, not an error. ``of`` keeps those of one
    target: a card id such as ``blk/6`` (its opset reference is resolved first) or a capture
    (``blk`` or ``blk:v1``: the module candidates for it)."""
    wanted = _wanted(repo, of)
    out = []
    for name in repo.names(CANDIDATES):
        for version in repo.versions(CANDIDATES, name):
            ref = f"{name}:v{version}"
            try:
                entry, _ = _entry(repo, repo.open(CANDIDATES, ref))
            except ModuleLensError as e:
                entry = _broken(ref, e)
            if wanted is None or entry.target in wanted:
                out.append(entry)
    return out


def _wanted(repo: Repository, of: str | None) -> set[str] | None:
    """The targets ``of`` stands for: a card id, or the versions of a capture."""
    if not of:
        return None
    if "/" in of:
        return {resolved_card_id(repo, of)}
    from modulelens.capture import KIND as CAPTURES

    if ":" in of:
        return {repo.open(CAPTURES, of).ref}
    return {f"{of}:v{v}" for v in repo.versions(CAPTURES, of)} or {repo.open(CAPTURES, of).ref}


class CandidateView(ToolReply):
    entry: CandidateEntry
    source: str = Field(description="The candidate source text.")
    source_path: str = Field(description="The source file in the repository.")
    entry_point: str = Field(description="card: the kernel's entry function; module: the class name (ModelNew).")
    params: dict[str, Any] = Field(default_factory=dict)
    provenance: dict[str, Any] = Field(default_factory=dict)
    report: ValidationReport | None = Field(None, description="The latest complete validation report in full.")
    left_out: list[LeftOut] = Field(default_factory=list, description="What was cut: source lines; of the report, "
                                    "checks past `top`, edge cases, details of layers in force, the wrapper evidence.")


def first_source_lines(view: CandidateView, lines: int | None) -> CandidateView:
    """``view`` with at most ``lines`` lines of its source (None: all); a cut is recorded in
    ``left_out`` with the source file, which has it all."""
    all_lines = view.source.splitlines(keepends=True)
    if lines is None or len(all_lines) <= lines:
        return view
    cut = LeftOut(field="source", shown=lines, total=len(all_lines), full=view.source_path)
    return view.model_copy(update={"source": "".join(all_lines[:lines]), "left_out": [*view.left_out, cut]})


def candidate_view(repo: Repository, candidate_id: str) -> CandidateView:
    """One candidate in full, card or module: its row, source (card kernels checked against their
    sha256) and latest complete report. A candidate that cannot be read is a clear error."""
    art = repo.open(CANDIDATES, candidate_id)
    entry, report = _entry(repo, art)
    if entry.kind == "module":
        art, cand, _ = load_module_candidate(repo, candidate_id)
        mm = art.manifest_as(ModuleCandidateManifest)
        return CandidateView(entry=entry, source=cand.source, source_path=str(art.file(mm.source_file)),
                             entry_point=cand.class_name, provenance=cand.provenance, report=report)
    art, src = load_candidate(repo, candidate_id)
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
