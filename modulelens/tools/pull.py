"""pull: fetch one artifact from a team repository (W&B) into the local repository, verified and untrusted."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.team.handover import pull as pull_from_remote
from modulelens.team.model import PulledArtifact


class PullRequest(BaseModel):
    address: str = Field(description="wandb://ENTITY/PROJECT/NAME:ALIAS, as push printed it (alias: latest, a tag, "
                         "local-vN or the W&B version vN).", json_schema_extra={"cli": "argument"})


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
        summary="Pull an artifact pushed with `push` from W&B: every file is checked against the remote's digests and "
        "the manifest's sha256, then stored as a new local version that stays untrusted (no replay, no validation) "
        "until `trust REF --yes`.",
    )
)
