"""list_candidates: the candidate kernels in the repository with their latest verdict."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.kernels.catalog import CandidateEntry, candidate_entries
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.tables import rows_table


class ListCandidatesRequest(BaseModel):
    card: str | None = Field(None, description="Only the candidates for this operator card (blk/6, blk:v1/6).")


class ListCandidatesResult(BaseModel):
    repo: str = Field(description="The repository folder.")
    candidates: list[CandidateEntry]


def list_candidates(req: ListCandidatesRequest, ctx: ToolContext) -> ListCandidatesResult:
    repo = Repository(ctx.repo_root)
    return ListCandidatesResult(repo=str(repo.root), candidates=candidate_entries(repo, req.card))


def _render(r: ListCandidatesResult):
    return rows_table(f"candidates in {r.repo}", ("candidate", "card", "op", "backend", "verdict", "speedup"),
                      ((c.candidate_id, c.card_id, c.op, c.backend, c.verdict or "not validated",
                        f"{c.speedup_vs_eager:.2f}x" if c.speedup_vs_eager else None) for c in r.candidates))

TOOL = register(
    Tool(
        name="list_candidates",
        request=ListCandidatesRequest,
        result=ListCandidatesResult,
        fn=list_candidates,
        summary="List the candidate kernels in the repository: card, backend, provider and the verdict, reason "
        "and speedup of their latest validation.",
        render=_render,
    )
)
