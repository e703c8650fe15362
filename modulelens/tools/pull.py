"""pull: fetch one artifact from a team repository (W&B) into the local repository, verified and untrusted."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.errors import tool_call
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import Repository
from modulelens.team.handover import pull as pull_from_remote
from modulelens.team.model import PulledArtifact


class PullRequest(BaseModel):
    address: str = Field(description="wandb://ENTITY/PROJECT/NAME:ALIAS, as push returned it.",
                         json_schema_extra={"cli": "argument"})


class PullResult(PulledArtifact, ToolReply):
    pass  # the team package's record; no docstring, so none in the JSON schema


@tool
def pull(req: PullRequest, ctx: ToolContext) -> PullResult:
    """Pull a pushed artifact from W&B, verified, as a local version untrusted until `trust`."""
    pulled = pull_from_remote(Repository(ctx.repo_root), req.address)
    result = PullResult(**pulled.model_dump())
    if not result.trusted:
        result.warnings.append(f"pulled untrusted: review it, then trust it with "
                               f"{tool_call('trust', ref=result.ref, kind=result.kind, yes=True)} before replaying or using it")
        result.next = [call("trust", ref=result.ref, kind=result.kind)]
    result.warnings += [f"tag not set: {t}" for t in result.tags_not_set][:3]
    return result
