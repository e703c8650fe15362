"""show: one thing the repository holds, in full, by kind: a capture, an operator card, a candidate
(with its latest report), a search tree, a statistics run, a stored pack or a validation report.

Long lists are cut to ``top`` items (``left_out`` says what was cut and where the whole data is);
``full`` adds what is long by nature (a capture's manifest, a candidate's whole source, the
definitions of statistics). Reading only: nothing is computed or run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from modulelens.capture import KIND as CAPTURES
from modulelens.capture import CaptureSummary, capture_manifest, capture_warnings, summarize
from modulelens.dispatch.pack import STORED_PACK_FILE, PackEnvironment
from modulelens.dispatch.results import PackUse
from modulelens.errors import tool_call
from modulelens.kinds import AcceptSingular
from modulelens.listing import MAX_ITEMS, MAX_REPLY_CHARS, LeftOut, keep_first
from modulelens.ops import CardDetail, describe_card
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import MANIFEST, Repository, is_trusted
from modulelens.search.summary import SearchSummary, search_summary
from modulelens.stats.runs import StatsRunView, TensorStatsRow, capture_tensor_rows, stats_view, thin_steps
from modulelens.team.packs import PACKS, PackedEntryView, PackManifest, entry_views
from modulelens.validation import (
    REPORT_FILE,
    REPORTS,
    CandidateView,
    ValidationReport,
    brief_report,
    candidate_view,
    first_source_lines,
    report_next,
    report_warnings,
    stored_report,
)

ShowKind = Literal["captures", "cards", "candidates", "searches", "stats", "packs", "reports"]
MAX_POINTS = 2000
DEFAULT_TOP = {"captures": 20, "searches": 12, "stats": 3, "reports": 20, "candidates": 8}
DEFAULT_STATS = ["std", "zero_frac", "mean", "rms", "kurtosis"]
SOURCE_LINES = 40  # of a candidate's source, without full
# What to show, for one kind only (how much to show, ``top``, ``points`` and ``full``, is ignored
# where it means nothing, so that one request can ask for everything of any kind).
_ONLY = {"tensors": ("captures",), "stats": ("stats",)}


class ShowRequest(BaseModel):
    kind: Annotated[ShowKind, AcceptSingular] = Field(json_schema_extra={"cli": "argument"})
    ref: str = Field(description="Its ref or id.", json_schema_extra={"cli": "argument"})
    top: int | None = Field(None, ge=1, le=MAX_ITEMS, description="Items per list (default per kind).")
    tensors: bool = Field(False, description="capture: tensor statistics.")
    full: bool = Field(False, description="Also the manifest, whole source or definitions.")
    stats: list[str] = Field(default_factory=lambda: list(DEFAULT_STATS), description="stats: which (std, mean, rms, gain, kurtosis, ...).")
    points: int = Field(8, ge=1, le=MAX_POINTS, description="stats: steps per series.")

    @model_validator(mode="after")
    def _fits_kind(self) -> ShowRequest:
        for name, kinds in _ONLY.items():
            if name in self.model_fields_set and self.kind not in kinds and getattr(self, name):
                raise ValueError(f"[--{name.replace('_', '-')}] goes with kind {' or '.join(kinds)}, not {self.kind}")
        return self


class ShowCaptureResult(CaptureSummary, ToolReply):
    manifest: dict[str, Any] = Field(default_factory=dict, description="With full: the manifest (fields that do "
                                     "not fit are named in left_out; the manifest file has them).")
    tensors: list[TensorStatsRow] = Field(
        default_factory=list, description="With tensors: inputs, outputs, weights (and gradients when captured), in "
        "that order. std is the population std; kurtosis is the excess kurtosis.")
    tensor_notes: list[str] = Field(default_factory=list, description="With tensors: how shape-only tensors were "
                                    "described.")
    left_out: list[LeftOut] = Field(default_factory=list, description="Lists cut to `top` items.")


class ShowPackResult(ToolReply):
    ref: str = Field(description="name:vN of the stored pack.")
    path: str = Field(description="Its pack file (what run and check_pack take as pack).")
    sha256: str
    trusted: bool = Field(description="Signed here: loadable. Else review and trust it first.")
    environment: PackEnvironment
    entries: list[PackedEntryView] = Field(description="With the hits of the last run (per phase) and check.")
    candidates: list[str]
    last_run: PackUse | None = None
    last_check: PackUse | None = None


class ShowReportResult(ValidationReport, ToolReply):
    ref: str = Field(description="name:vN of the report.")
    left_out: list[LeftOut] = Field(default_factory=list, description="What was cut: checks past `top`, edge "
                                    "cases, details of layers in force, the wrapper evidence; the stored report has it.")


ShowResult = (ShowCaptureResult | CardDetail | CandidateView | SearchSummary | StatsRunView | ShowPackResult
              | ShowReportResult)


def _capture(repo: Repository, req: ShowRequest, top: int) -> ShowCaptureResult:
    art = repo.open(CAPTURES, req.ref)
    aliases = sorted(k for k, v in repo.aliases(CAPTURES, art.name).items() if v == art.version)
    manifest, cut = _manifest_within(capture_manifest(art).model_dump(mode="json"), str(art.path / MANIFEST)) \
        if req.full else ({}, [])
    rows, notes = [], []
    if req.tensors:
        _, rows, notes = capture_tensor_rows(repo, art.ref)
    result = ShowCaptureResult(**dict(summarize(art, aliases)), manifest=manifest, tensors=rows, tensor_notes=notes,
                               left_out=cut)
    result.warnings = capture_warnings(result)
    result.next = [call("replay_module", ref=art.ref), call("capture_ops", ref=art.ref)]
    return keep_first(result, "tensors", top, f"modulelens://captures/{art.ref}")


MANIFEST_CHARS = 6_000  # of a capture's manifest in a reply (with full); the manifest file has it all


def _manifest_within(manifest: dict[str, Any], file: str) -> tuple[dict[str, Any], list[LeftOut]]:
    """``manifest`` with its fields, smallest first, while they fit in ``MANIFEST_CHARS``
    characters of JSON; each field left out is named in a :class:`LeftOut` pointing to ``file``."""
    sizes = {k: len(json.dumps(v, separators=(",", ":"))) + len(k) + 4 for k, v in manifest.items()}
    kept: dict[str, Any] = {}
    cut: list[LeftOut] = []
    room = MANIFEST_CHARS
    for key in sorted(manifest, key=lambda k: sizes[k]):
        if sizes[key] <= room:
            kept[key], room = manifest[key], room - sizes[key]
        else:
            value = manifest[key]
            cut.append(LeftOut(field=f"manifest.{key}", shown=0,
                               total=len(value) if isinstance(value, list | dict) else 1, full=file))
    return {k: kept[k] for k in manifest if k in kept}, cut


def _candidate(repo: Repository, req: ShowRequest, top: int) -> CandidateView:
    view = first_source_lines(candidate_view(repo, req.ref), None if req.full else SOURCE_LINES)
    cid, card = view.entry.candidate_id, view.entry.card_id
    if view.report is not None and view.entry.report is not None:  # the stored report has it all
        full = str(repo.open(REPORTS, view.entry.report).file(REPORT_FILE))
        rest = len(view.model_copy(update={"report": None}).model_dump_json()) + 600  # with warnings and next
        budget = None if req.top is not None else MAX_REPLY_CHARS - rest  # a top asked for is given
        brief, cut = brief_report(view.report, top, full, prefix="report.", budget=budget)
        view = view.model_copy(update={"report": brief, "left_out": [*view.left_out, *cut]})
    if view.report is None:
        view.warnings = ["never validated: its correctness and speed are unknown"]
        view.next = [call("validate_kernel", candidate=cid)]
    else:
        view.warnings = report_warnings(view.report)
        view.next = report_next(view.report, cid, view.entry.target or card,
                                view.provenance.get("source_file"), provider=view.entry.provider or "agent",
                                module=view.entry.kind == "module")
    return view


def _pack(repo: Repository, ref: str) -> ShowPackResult:
    art = repo.open(PACKS, ref)
    m = art.manifest_as(PackManifest)
    path = str(art.file(STORED_PACK_FILE))
    entries, last_run, last_check = entry_views(repo, art)
    result = ShowPackResult(ref=art.ref, path=path, sha256=m.sha256, trusted=is_trusted(art.path),
                            environment=m.environment, entries=entries, candidates=m.candidates, last_run=last_run,
                            last_check=last_check)
    if not result.trusted:
        result.warnings.append(f"not trusted here: review it with {tool_call('trust', ref=art.ref, kind='packs')}, then trust "
                               f"it with {tool_call('trust', ref=art.ref, kind='packs', yes=True)} before using it")
    result.warnings += [f"{e.candidate_id} will not be used: {e.verdict}, speedup {e.speedup_vs_eager}"
                        for e in m.entries if not e.dispatched]
    if last_check is not None and not last_check.ok:
        result.warnings.append(f"its last check was not ok: {last_check.summary}")
    if result.trusted and any(e.dispatched for e in m.entries):
        result.next = [call("check_pack", pack=art.ref)]
    return result


def _report(repo: Repository, ref: str, top: int, budget: int | None) -> ShowReportResult:
    name, report = stored_report(repo, ref)
    result = ShowReportResult(**dict(report), ref=name)
    result.warnings = report_warnings(report)
    brief, cut = brief_report(result, top, str(repo.open(REPORTS, name).file(REPORT_FILE)), budget=budget)
    return brief.model_copy(update={"left_out": cut})


@tool
def show(req: ShowRequest, ctx: ToolContext) -> ShowResult:
    """Show one stored artifact (a candidate with its report, a search as its tree)."""
    repo = Repository(ctx.repo_root)
    top = req.top or DEFAULT_TOP.get(req.kind, 20)
    if req.kind == "captures":
        return _capture(repo, req, top)
    if req.kind == "cards":
        card = describe_card(repo, req.ref)
        card.next = [call("generate_kernel", card=card.card_id), call("list", kind="candidates", of=card.card_id)]
        return card
    if req.kind == "candidates":
        return _candidate(repo, req, top)
    if req.kind == "searches":
        summary = search_summary(repo, req.ref, top)
        summary.next = [call("optimize", targets=[t.target for t in summary.targets], search_id=summary.search_id)]
        return summary
    if req.kind == "stats":
        return _stats(repo, req, top)
    if req.kind == "packs":
        return _pack(repo, req.ref)
    return _report(repo, req.ref, top, None if req.top is not None else MAX_REPLY_CHARS)  # a top asked for is given


def _stats(repo: Repository, req: ShowRequest, top: int) -> StatsRunView:
    view = stats_view(repo, req.ref, req.stats)
    series = str(Path(view.path) / "series.json")
    for field in ("modules", "types", "tensors"):
        view = keep_first(view, field, top, series)
    if not req.full:
        view = view.model_copy(update={"definitions": {}})
    bad = [f for f in view.findings if f.kind.startswith("nan_inf")]
    if bad:
        view.warnings = [f"NaN/Inf first seen in {bad[0].module or 'the model'} ({bad[0].kind})"]
    return thin_steps(view, req.points)
