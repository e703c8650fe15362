"""list: what the repository holds, one kind at a time (captures, opsets, cards, candidates,
searches, packs, statistics runs, validation reports), oldest first, cut to ``limit`` entries.

Each kind has its own result model (its entries' field is named after the kind); every result says
which ``kind`` it is, and ``left_out`` says what was cut and where the whole list is. Reading only:
nothing is computed or run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from modulelens.capture import CaptureEntry, capture_entries
from modulelens.errors import tool_call
from modulelens.kinds import AcceptSingular
from modulelens.listing import MAX_ITEMS, LeftOut, keep_first
from modulelens.ops import OpsetEntry, OpSetSummary, opset_entries, summarize_opset
from modulelens.profiling.bandwidth import copy_bytes_per_s
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import Repository
from modulelens.search.summary import SearchEntry, search_entries
from modulelens.stats.runs import StatsRunEntry, stats_entries
from modulelens.team.packs import PackListEntry, pack_entries
from modulelens.validation import CandidateEntry, ReportEntry, candidate_entries, report_entries

ListKind = Literal["captures", "opsets", "cards", "candidates", "searches", "packs", "stats", "reports"]
DEFAULT_LIMIT = 20
DEFAULT_CARDS = 10  # card rows are long
_RESOURCES = {"captures": "modulelens://captures", "stats": "modulelens://stats"}


class ListRequest(BaseModel):
    kind: Annotated[ListKind, AcceptSingular] = Field(json_schema_extra={"cli": "argument"})
    of: str | None = Field(None, description="A name, or the capture/opset/card/candidate they belong to "
                           "(cards: their opset, required).",
                           json_schema_extra={"cli": "argument"})
    op_kind: Literal["memory", "compute", "view"] | None = Field(None, description="cards: only this kind.")
    limit: int | None = Field(None, ge=1, le=MAX_ITEMS, description="Default: 20 (cards 10).")

    @model_validator(mode="after")
    def _fits_kind(self) -> ListRequest:
        if self.kind == "cards" and not self.of:
            raise ValueError("kind cards needs the opset to list as of (a capture name such as blk, or blk:v2)")
        if self.op_kind is not None and self.kind != "cards":
            raise ValueError(f"[--op-kind] goes with kind cards, not {self.kind}")
        return self


class Listing(ToolReply):
    kind: str = Field(description="What is listed.")
    repo: str = Field(description="The repository folder.")
    left_out: list[LeftOut] = Field(default_factory=list)


class ListCapturesResult(Listing):
    captures: list[CaptureEntry]


class ListOpsetsResult(Listing):
    opsets: list[OpsetEntry]


class ListCardsResult(OpSetSummary):
    kind: str = Field("cards", description="What is listed.")


class ListCandidatesResult(Listing):
    candidates: list[CandidateEntry]


class ListSearchesResult(Listing):
    searches: list[SearchEntry]


class ListPacksResult(Listing):
    packs: list[PackListEntry]


class ListStatsRunsResult(Listing):
    runs: list[StatsRunEntry]


class ListReportsResult(Listing):
    reports: list[ReportEntry]


ListResult = (ListCapturesResult | ListOpsetsResult | ListCardsResult | ListCandidatesResult | ListSearchesResult
              | ListPacksResult | ListStatsRunsResult | ListReportsResult)


def _cards(repo: Repository, req: ListRequest) -> ListCardsResult:
    summary = summarize_opset(repo, req.of or "", kind=req.op_kind, top=req.limit or DEFAULT_CARDS,
                              copy_bandwidth=copy_bytes_per_s)
    result = ListCardsResult(**dict(summary))
    if result.cards:
        top = result.cards[0].card_id
        result.next = [call("generate_kernel", card=top), call("show", kind="cards", ref=top)]
    return result


# kind -> (its result model, the field holding its entries, the domain function listing them)
_KINDS: dict[str, tuple[type[Listing], str, Callable[[Repository, str | None], list[Any]]]] = {
    "captures": (ListCapturesResult, "captures", capture_entries),
    "opsets": (ListOpsetsResult, "opsets", opset_entries),
    "candidates": (ListCandidatesResult, "candidates", candidate_entries),
    "searches": (ListSearchesResult, "searches", search_entries),
    "packs": (ListPacksResult, "packs", pack_entries),
    "stats": (ListStatsRunsResult, "runs", stats_entries),
    "reports": (ListReportsResult, "reports", report_entries),
}


def _advice(result: Listing) -> None:
    """Warnings and next calls of a listing, from its entries."""
    if isinstance(result, ListCapturesResult) and result.captures:
        result.warnings += [f"{c.ref} holds shape-only data: its replays synthesise inputs and cannot compare "
                            "outputs" for c in result.captures if c.shape_only][:3]
        last = result.captures[-1].ref
        result.next = [call("show", kind="captures", ref=last), call("replay_module", ref=last)]
    elif isinstance(result, ListOpsetsResult) and result.opsets:
        result.next = [call("list", kind="cards", of=result.opsets[-1].ref)]
    elif isinstance(result, ListCandidatesResult) and result.candidates:
        readable = [c for c in result.candidates if c.kind != "broken"]
        result.warnings += [f"candidate {c.candidate_id} cannot be read: {c.problem}" for c in result.candidates
                            if c.kind == "broken"][:3]
        unvalidated = [c.candidate_id for c in readable if c.verdict is None]
        if unvalidated:
            result.next = [call("validate_kernel", candidate=unvalidated[0])]
        elif readable:
            result.next = [call("show", kind="candidates", ref=readable[-1].candidate_id)]
    elif isinstance(result, ListSearchesResult) and result.searches:
        result.next = [call("show", kind="searches", ref=result.searches[-1].search_id)]
    elif isinstance(result, ListPacksResult) and result.packs:
        result.warnings += [f"pack {p.ref} is not trusted here: review it with {tool_call('trust', ref=p.ref, kind='packs')}, "
                            f"then trust it with {tool_call('trust', ref=p.ref, kind='packs', yes=True)} before using it"
                            for p in result.packs if not p.trusted][:3]
        result.warnings += [f"pack {p.ref}: none of its {p.entries} entries will be used (none was validated correct "
                            "and faster than eager)" for p in result.packs if not p.dispatched][:3]
        result.next = [call("show", kind="packs", ref=result.packs[-1].ref)]
    elif isinstance(result, ListStatsRunsResult) and result.runs:
        result.next = [call("show", kind="stats", ref=result.runs[-1].run_id)]
    elif isinstance(result, ListReportsResult) and result.reports:
        result.next = [call("show", kind="reports", ref=result.reports[-1].report)]


@tool
def list_(req: ListRequest, ctx: ToolContext) -> ListResult:
    """List the stored artifacts of a kind."""
    repo = Repository(ctx.repo_root)
    if req.kind == "cards":
        return _cards(repo, req)
    model, field, entries_of = _KINDS[req.kind]
    entries = entries_of(repo, req.of)
    result = model(kind=req.kind, repo=str(repo.root), **{field: entries})
    if not entries:
        where = f" of {req.of}" if req.of else ""
        result.warnings.append(f"no {req.kind}{where} in {repo.root}: is this the repository you meant?")
    _advice(result)
    return keep_first(result, field, req.limit or DEFAULT_LIMIT,
                      _RESOURCES.get(req.kind, str(repo.root / req.kind)))
