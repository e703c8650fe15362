"""push: send one stored version (a candidate with its latest report) to a team repository (W&B)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.team.handover import push as push_to_remote
from modulelens.team.model import PushKind, PushOutcome


class PushRequest(BaseModel):
    ref: str = Field(description="Reference to push: name, name:v3 or name@tag.", json_schema_extra={"cli": "argument"})
    to: str = Field(description="Team repository: wandb://ENTITY/PROJECT. Credentials come from WANDB_API_KEY or "
                    "`wandb login`; WANDB_MODE=offline logs the run locally for `wandb sync`.")
    kind: PushKind = Field("captures", description="What kind of artifact the reference names.")


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
        summary="Push a capture, opset, candidate (with its latest report), report or stats run to a W&B project as "
        "an artifact: every file with its checksums, the manifest as metadata, local tags as aliases, and the "
        "artifacts it was made from as lineage. Pull it elsewhere with the address it prints.",
    )
)
