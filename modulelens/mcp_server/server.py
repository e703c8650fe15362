"""The MCP server, generated from a list of tools.

Each :class:`~modulelens.registry.Tool` becomes one MCP tool with the same name. Its input schema
is the request model's fields as flat arguments (same names as the CLI options, with underscores);
its output schema is the result model, returned as structured content. The tool function runs in
a worker thread so the event loop keeps serving; ``ToolContext.progress`` is forwarded as MCP
progress notifications. A :class:`~modulelens.errors.ModuleLensError` becomes a tool error result
(``is_error``) whose text holds the message and the hint.

When the tools include ``list_captures`` and ``show_capture``, two resources are exposed as well:
``modulelens://captures`` (``list_captures`` with its defaults, as JSON) and the template
``modulelens://captures/{ref}`` (``show_capture`` for ``ref``, as JSON). A ref such as
``enc0:v2`` or ``enc0@prod`` can be written as is or percent-encoded (``enc0%3Av2``); the
template matcher decodes it. Likewise, with ``list_stats_runs`` and ``show_stats_run``, statistics
runs are resources: ``modulelens://stats`` and ``modulelens://stats/{ref}``.

In stdio mode stdout is the protocol wire: nothing here prints, logging goes to stderr.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, ValidationError

from modulelens.errors import ModuleLensError
from modulelens.mcp_server.calls import call_tool, error_text, validation_text
from modulelens.mcp_server.jobs import add_job_tools
from modulelens.mcp_server.resources import add_listing_resources
from modulelens.mcp_server.schema import context_name, describe, parameter
from modulelens.registry import Tool
from modulelens.tools import all_tools
from modulelens.version import package_version

__all__ = ["CAPTURES_URI", "CAPTURE_TEMPLATE", "build_server", "run_stdio"]

logger = logging.getLogger(__name__)

CAPTURES_URI = "modulelens://captures"
CAPTURE_TEMPLATE = "modulelens://captures/{ref}"
STATS_URI = "modulelens://stats"
STATS_TEMPLATE = "modulelens://stats/{ref}"

INSTRUCTIONS = (
    "modulelens captures the inputs and outputs of PyTorch modules while a script runs, stores "
    "them as versioned artifacts in a repository, and replays them. Every tool here is also a "
    "`modulelens` CLI command with the same argument names."
)


def _make_handler(tool: Tool, repo_root: Path | None) -> Any:
    fields = dict(tool.request.model_fields)
    ctx_name = context_name(fields)
    params = [parameter(name, field) for name, field in fields.items()]

    async def handler(**kwargs: Any) -> BaseModel:
        ctx = kwargs.pop(ctx_name, None)
        try:
            request = tool.request.model_validate(kwargs)
        except ValidationError as exc:
            raise ToolError(validation_text(exc)) from exc
        try:
            return await call_tool(tool, request, repo_root, ctx)
        except ModuleLensError as exc:
            raise ToolError(error_text(exc)) from exc

    ctx_param = inspect.Parameter(
        ctx_name, inspect.Parameter.KEYWORD_ONLY, annotation=Context
    )
    handler.__name__ = tool.name
    handler.__qualname__ = tool.name
    handler.__doc__ = tool.summary
    # MCP reads the signature for the arguments and typing.get_type_hints() for the context
    # parameter and the return type (the output schema): both must be set.
    signature = inspect.Signature([*params, ctx_param], return_annotation=tool.result)
    handler.__signature__ = signature  # type: ignore[attr-defined]
    handler.__annotations__ = {p.name: p.annotation for p in params} | {
        ctx_name: Context,
        "return": tool.result,
    }
    return handler


def build_server(tools: list[Tool], repo_root: Path | None = None) -> MCPServer:
    """An MCP server exposing ``tools`` (and the capture resources when those tools are present).

    ``repo_root`` None means :func:`~modulelens.registry.default_repo_root` at each call.
    """
    server = MCPServer(name="modulelens", instructions=INSTRUCTIONS, version=package_version())
    by_name: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in by_name:
            raise ValueError(f"tool {tool.name!r} given twice")
        by_name[tool.name] = tool
        server.add_tool(
            _make_handler(tool, repo_root),
            name=tool.name,
            description=describe(tool),
            structured_output=True,
        )
    add_job_tools(server, by_name, repo_root)
    if "list_captures" in by_name and "show_capture" in by_name:
        add_listing_resources(
            server, by_name["list_captures"], by_name["show_capture"], repo_root,
            uri=CAPTURES_URI, template=CAPTURE_TEMPLATE, name="captures", item="capture", ref_field="ref",
        )
    if "list_stats_runs" in by_name and "show_stats_run" in by_name:
        add_listing_resources(
            server, by_name["list_stats_runs"], by_name["show_stats_run"], repo_root,
            uri=STATS_URI, template=STATS_TEMPLATE, name="stats", item="statistics run", ref_field="run",
        )
    return server


def run_stdio(repo_root: Path | None = None) -> None:
    """Serve every registered tool over stdio. mcp's stdio transport moves fd 1 to stderr while it
    serves the protocol from a private duplicate, so a stray print cannot corrupt the wire."""
    server = build_server(all_tools(), repo_root)
    server.run("stdio")
