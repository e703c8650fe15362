"""list_captures: every capture name in the repository with its versions and tags."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.capture.manifest import KIND, capture_manifest
from modulelens.listing import LeftOut, keep_first
from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository


class ListCapturesRequest(BaseModel):
    name: str | None = Field(None, description="Only this name's versions.")
    limit: int | None = Field(25, ge=1, description="Entries listed (null: all).")


class CaptureEntry(BaseModel):
    ref: str
    name: str
    version: int
    tags: list[str]
    module_path: str
    class_path: str
    strategies: list[str]
    created_at: str


class ListCapturesResult(BaseModel):
    repo: str = Field(description="The repository folder.")
    captures: list[CaptureEntry]
    left_out: list[LeftOut] = Field(default_factory=list)


def list_captures(req: ListCapturesRequest, ctx: ToolContext) -> ListCapturesResult:
    repo = Repository(ctx.repo_root)
    names = [req.name] if req.name else repo.names(KIND)
    out = []
    for name in names:
        if req.name:
            repo.resolve(KIND, name)  # clear error for an unknown name
        aliases = repo.aliases(KIND, name)
        for v in repo.versions(KIND, name):
            m = capture_manifest(repo.open(KIND, f"{name}:v{v}"))
            out.append(
                CaptureEntry(
                    ref=f"{name}:v{v}", name=name, version=v,
                    tags=sorted(k for k, x in aliases.items() if x == v),
                    module_path=m.module_path, class_path=m.class_path,
                    strategies=list(m.strategies), created_at=m.created_at,
                )
            )
    return keep_first(ListCapturesResult(repo=str(repo.root), captures=out), "captures", req.limit,
                      "modulelens://captures")


TOOL = register(
    Tool(
        name="list_captures",
        request=ListCapturesRequest,
        result=ListCapturesResult,
        fn=list_captures,
        summary="List captures with versions, tags and replay strategies.",
    )
)
