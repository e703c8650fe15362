"""show_candidate: one candidate kernel in full: source, provenance and latest validation report."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.validation.catalog import CandidateView, candidate_view, first_source_lines


class ShowCandidateRequest(BaseModel):
    candidate: str = Field(description="Candidate id (blk.card6:v1).",
                           json_schema_extra={"cli": "argument"})
    source_lines: int | None = Field(40, ge=1, description="Source lines shown (null: all).")


def show_candidate(req: ShowCandidateRequest, ctx: ToolContext) -> CandidateView:
    return first_source_lines(candidate_view(Repository(ctx.repo_root), req.candidate), req.source_lines)


TOOL = register(
    Tool(
        name="show_candidate",
        request=ShowCandidateRequest,
        result=CandidateView,
        fn=show_candidate,
        summary="Show one candidate: source and latest validation report.",
    )
)
