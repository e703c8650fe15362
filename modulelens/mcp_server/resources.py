"""Resources over the ``list`` and ``show`` tools for one kind (captures, statistics runs), as JSON:
as much data as the tools give (``top``/``limit`` at their maximum, see
:func:`modulelens.listing.everything`) within the size of a reply (compact JSON; what the tool cuts
is named in its ``left_out``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp.server.mcpserver.resources.templates import ResourceSecurity
from pydantic import ValidationError

from modulelens.errors import ModuleLensError, ReferenceNotFound
from modulelens.listing import everything
from modulelens.mcp_server.calls import call_tool, error_text, validation_text
from modulelens.registry import Tool
from modulelens.replies import rendered_reply


def add_listing_resources(
    server: MCPServer, list_tool: Tool, show_tool: Tool, repo_root: Path | None, *,
    uri: str, template: str, name: str, item: str, kinds: tuple[str, str],
) -> None:
    """Two resources: ``uri`` lists one kind (``list_tool`` for ``kinds[0]``) and ``template``
    shows one of them (``show_tool`` for ``kinds[1]`` and the template's ``ref``), as JSON."""
    list_kind, show_kind = kinds

    async def read(tool: Tool, request_data: dict[str, Any]) -> str:
        try:
            request = tool.request.model_validate({**everything(tool.request), **request_data})
            result = await call_tool(tool, request, repo_root, None)
        except ReferenceNotFound as exc:
            raise ResourceNotFoundError(error_text(exc)) from exc
        except ModuleLensError as exc:
            raise ResourceError(error_text(exc)) from exc
        except ValidationError as exc:
            raise ResourceError(validation_text(exc)) from exc
        return json.dumps(rendered_reply(result, "args"), separators=(",", ":"))  # compact, as tool replies

    @server.resource(
        uri,
        name=name,
        description=f"Every {item} in the repository ({list_tool.name} of {list_kind}), as JSON.",
        mime_type="application/json",
    )
    async def listing() -> str:
        return await read(list_tool, {"kind": list_kind})

    # The default ResourceSecurity rejects values that look like absolute paths, and a one-letter
    # name with a version ("a:v2") looks like a Windows drive ("a:"). Refs are validated by the
    # repository itself (InvalidName), exactly as when the show tool is called as a tool.
    @server.resource(
        template,
        name=item.replace(" ", "_"),
        description=f"One {item} ({show_tool.name} of a {show_kind} ref, e.g. enc0, enc0:v2, enc0@prod), as JSON.",
        mime_type="application/json",
        security=ResourceSecurity(exempt_params={"ref"}),
    )
    async def one(ref: str) -> str:
        return await read(show_tool, {"kind": show_kind, "ref": ref})
