"""show_pack: one stored kernel pack: its file, environment, entries and what its last run and
check found."""

from __future__ import annotations

from pydantic import BaseModel, Field

from modulelens.registry import Tool, ToolContext, register
from modulelens.repo import Repository
from modulelens.team.pack_listing import PackView, pack_view


class ShowPackRequest(BaseModel):
    pack: str = Field(description="Pack file or stored pack NAME[:vN].", json_schema_extra={"cli": "argument"})


def show_pack(req: ShowPackRequest, ctx: ToolContext) -> PackView:
    return pack_view(Repository(ctx.repo_root), req.pack)


TOOL = register(
    Tool(
        name="show_pack",
        request=ShowPackRequest,
        result=PackView,
        fn=show_pack,
        summary="Show one stored pack in full.",
    )
)
