"""push: send one stored version (a candidate with its latest report; a pack file, stored first) to a
team repository (W&B)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.team.handover import push as push_to_remote
from modulelens.team.model import PushKind, PushOutcome


class PushRequest(BaseModel):
    ref: str = Field(description="Ref to push.", json_schema_extra={"cli": "argument"})
    to: str = Field(description="wandb://ENTITY/PROJECT (login: WANDB_API_KEY or `wandb login`).")
    kind: PushKind = Field("captures", description="Kind of artifact ref names.")


class PushResult(PushOutcome):
    pass  # the team package's record; no docstring, so none in the JSON schema


def push(req: PushRequest, ctx: ToolContext) -> PushResult:
    outcome = push_to_remote(Repository(ctx.repo_root), req.kind, req.ref, req.to)
    return PushResult(**outcome.model_dump())


TOOL = register(
    Tool(
        name="push",
        request=PushRequest,
        result=PushResult,
        fn=push,
        summary="Push a stored version to W&B as an artifact (files, checksums, tags, lineage); pull it "
        "elsewhere by the returned address.",
    )
)
