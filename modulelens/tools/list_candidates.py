"""list_candidates: the candidate kernels in the repository with their latest verdict."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.kernels.candidates import CANDIDATES
from modulelens.listing import LeftOut, keep_first
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.validation.catalog import CandidateEntry, candidate_entries


class ListCandidatesRequest(BaseModel):
    card: str | None = Field(None, description="Only this card's.")
    limit: int | None = Field(15, ge=1, description="Entries listed (null: all).")


class ListCandidatesResult(BaseModel):
    repo: str = Field(description="The repository folder.")
    candidates: list[CandidateEntry]
    left_out: list[LeftOut] = Field(default_factory=list)


def list_candidates(req: ListCandidatesRequest, ctx: ToolContext) -> ListCandidatesResult:
    repo = Repository(ctx.repo_root)
    result = ListCandidatesResult(repo=str(repo.root), candidates=candidate_entries(repo, req.card))
    return keep_first(result, "candidates", req.limit, str(repo.root / CANDIDATES))


TOOL = register(
    Tool(
        name="list_candidates",
        request=ListCandidatesRequest,
        result=ListCandidatesResult,
        fn=list_candidates,
        summary="List candidate kernels with their latest verdict, reason and speedup.",
    )
)
