"""pull: fetch one artifact from a team repository (W&B) into the local repository, verified and untrusted."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.team.handover import pull as pull_from_remote
from modulelens.team.model import PulledArtifact


class PullRequest(BaseModel):
    address: str = Field(description="wandb://ENTITY/PROJECT/NAME:ALIAS from push (ALIAS: latest, a tag, local-vN, vN).",
                         json_schema_extra={"cli": "argument"})


class PullResult(PulledArtifact):
    pass  # the team package's record; no docstring, so none in the JSON schema


def pull(req: PullRequest, ctx: ToolContext) -> PullResult:
    pulled = pull_from_remote(Repository(ctx.repo_root), req.address)
    return PullResult(**pulled.model_dump())


TOOL = register(
    Tool(
        name="pull",
        request=PullRequest,
        result=PullResult,
        fn=pull,
        summary="Pull a pushed artifact from W&B, verified, as a local version untrusted until `trust`.",
    )
)
