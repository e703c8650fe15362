"""add_search_child: the agent's own kernel as a child of a node of a search tree, evaluated now."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.errors import ModuleLensError
from modulelens.kernels import KernelSource, read_source_file
from modulelens.paths import outside_warnings, source_file
from modulelens.registry import ToolContext, tool
from modulelens.replies import ToolReply, call
from modulelens.repo import Repository
from modulelens.search.loop import add_child
from modulelens.search.model import NodeRecord
from modulelens.search.store import open_search


class AddSearchChildRequest(BaseModel):
    search_id: str = Field(json_schema_extra={"cli": "argument"})
    parent: int = Field(0, ge=0, description="Node (0: the root).")
    target: str = Field("0", description="Card id or target index.")
    source: str | None = Field(None, description="Or: your source file.")
    source_text: str | None = Field(None, description="Or: the source itself.")
    allow_outside: bool = Field(False, description="Read or write a path outside the project and the repository.")


class AddSearchChildResult(NodeRecord, ToolReply):
    search_id: str
    target: str
    source_file: str | None = Field(None, description="The file the source was read from (symlinks followed).")


@tool
def add_search_child(req: AddSearchChildRequest, ctx: ToolContext) -> AddSearchChildResult:
    """Add your own kernel under a node of an optimize search (validated)."""
    if bool(req.source) == bool(req.source_text):
        raise ModuleLensError("give exactly one of [--source FILE] or [--source-text TEXT]",
                              "e.g. [--parent 2] [--source my_kernel.cpp]")
    text, path = req.source_text or "", None
    if req.source:
        path = source_file(req.source, ctx.project, ctx.repo_root, req.allow_outside or ctx.paths_typed_by_person)
        text = read_source_file(path)  # named like a source, at most 1 MiB
    repo = Repository(ctx.repo_root)
    search = open_search(repo, req.search_id)
    card_id, node = add_child(repo, req.search_id, req.target, req.parent,
                              KernelSource(backend=search.settings.backend, source=text, provider="agent"))
    result = AddSearchChildResult(**node.model_dump(), search_id=req.search_id, target=card_id,
                                  source_file=str(path) if path else None)
    result.warnings += outside_warnings(path, ctx.project, ctx.repo_root)
    if not node.correct:
        result.warnings.append(f"rejected: {node.reason}")
    elif node.speedup_vs_eager is None:
        result.warnings.append("correct, but its speed was not determined here")
    result.next = [call("show", kind="searches", ref=req.search_id)]
    return result
