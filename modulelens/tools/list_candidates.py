"""list_candidates: the candidate kernels in the repository with their latest verdict."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.kernels.catalog import CandidateEntry, candidate_entries
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ListCandidatesRequest(BaseModel):
    card: str | None = Field(None, description="Only this card's.")


class ListCandidatesResult(BaseModel):
    repo: str = Field(description="The repository folder.")
    candidates: list[CandidateEntry]


def list_candidates(req: ListCandidatesRequest, ctx: ToolContext) -> ListCandidatesResult:
    repo = Repository(ctx.repo_root)
    return ListCandidatesResult(repo=str(repo.root), candidates=candidate_entries(repo, req.card))


TOOL = register(
    Tool(
        name="list_candidates",
        request=ListCandidatesRequest,
        result=ListCandidatesResult,
        fn=list_candidates,
        summary="List candidate kernels with their latest verdict, reason and speedup.",
    )
)
