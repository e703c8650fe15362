"""push: send one stored version (a candidate with its latest report; a pack file, stored first) to a
team repository (W&B)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from modulelens.kinds import AcceptSingular
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply
from modulelens.repo import Repository
from modulelens.team.handover import push as push_to_remote
from modulelens.team.model import PushKind, PushOutcome
from modulelens.team.packs import PACKS, given_pack_file


class PushRequest(BaseModel):
    ref: str = Field(description="Ref to push.", json_schema_extra={"cli": "argument"})
    to: str = Field(description="wandb://ENTITY/PROJECT.")
    kind: Annotated[PushKind, AcceptSingular] = Field("captures")


class PushResult(PushOutcome, ToolReply):
    pass  # the team package's record; no docstring, so none in the JSON schema


@tool
def push(req: PushRequest, ctx: ToolContext) -> PushResult:
    """Push a stored version to W&B (files, checksums, tags, lineage), to `pull` elsewhere."""
    given = given_pack_file(req.ref, ctx.project, "ref") if req.kind == PACKS else None  # a pack file, not a ref
    outcome = push_to_remote(Repository(ctx.repo_root), req.kind, str(given) if given else req.ref, req.to)
    result = PushResult(**outcome.model_dump())
    if result.offline:
        result.warnings.append(f"logged offline: nothing was uploaded until the run folder is synced (wandb sync {result.run})")
    return result
