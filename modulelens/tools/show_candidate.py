"""show_candidate: one candidate kernel in full: source, provenance and latest validation report."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.kernels.catalog import CandidateView, candidate_view
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ShowCandidateRequest(BaseModel):
    candidate: str = Field(description="Candidate id (blk.card6:v1, blk.card6 for the latest).",
                           json_schema_extra={"cli": "argument"})


def show_candidate(req: ShowCandidateRequest, ctx: ToolContext) -> CandidateView:
    return candidate_view(Repository(ctx.repo_root), req.candidate)


TOOL = register(
    Tool(
        name="show_candidate",
        request=ShowCandidateRequest,
        result=CandidateView,
        fn=show_candidate,
        summary="Show one candidate kernel: its card, backend, provider, source, and its latest validation report "
        "(verdict, reason, checks, timings, speedups).",
    )
)
