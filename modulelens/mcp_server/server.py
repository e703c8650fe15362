"""The MCP server, generated from a tool registry.

Each :class:`~modulelens.registry.Tool` (but those declared ``mcp=False``) becomes one MCP tool with
the same name. Its input schema is the request model's fields as flat arguments (same names as the
CLI options, with underscores), compacted (:mod:`modulelens.mcp_server.schema`); ``tools/list``
stays small: it publishes no output schema; the resource ``modulelens://schemas/{tool}`` is the
result model's full schema, every field described.

A call goes one way for every tool: arguments sent as JSON text (lists, objects, null) are parsed,
then checked once against the request model, strictly: unknown names are refused with the valid
ones and a did-you-mean, type or value errors come back one line per field
(:mod:`modulelens.arguments`). The tool function runs in a worker thread so the event loop keeps
serving; ``ToolContext.progress`` is forwarded as MCP progress notifications
(:mod:`modulelens.mcp_server.calls`). The result is the structured content, and the text content is
the same data as compact JSON, so a client that reads only one of them sees everything: the
result's fields, its ``warnings`` and its ``next`` calls (argument markers written as argument
names). A :class:`~modulelens.errors.ModuleLensError` becomes a tool error result (``is_error``)
whose text holds the message and the hint, arguments named as tool arguments.

Captures and statistics runs are resources too: ``modulelens://captures`` (``list`` of captures,
as JSON) and the template ``modulelens://captures/{ref}`` (``show`` of a capture), likewise
``modulelens://stats`` and ``modulelens://stats/{ref}``. A ref such as ``enc0:v2`` or
``enc0@prod`` can be written as is or percent-encoded (``enc0%3Av2``).

In stdio mode stdout is the protocol wire: nothing here prints, logging goes to stderr.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from mcp.types import Tool as MCPTool
from pydantic import BaseModel, ValidationError

from modulelens.arguments import loose_booleans, parse_json_text, unknown_names
from modulelens.errors import ModuleLensError
from modulelens.mcp_server.calls import call_tool, error_text, validation_text
from modulelens.mcp_server.jobs import job_tools
from modulelens.mcp_server.resources import add_listing_resources
from modulelens.mcp_server.schema import (
    SCHEMA_TEMPLATE,
    describe,
    input_schema,
    result_schema_page,
    shared_arguments_text,
)
from modulelens.registry import Tool, ToolRegistry
from modulelens.replies import rendered_reply
from modulelens.tools import all_tools
from modulelens.version import package_version

__all__ = ["CAPTURES_URI", "CAPTURE_TEMPLATE", "SCHEMA_TEMPLATE", "build_server", "reply", "run_stdio"]

logger = logging.getLogger(__name__)

CAPTURES_URI = "modulelens://captures"
CAPTURE_TEMPLATE = "modulelens://captures/{ref}"
STATS_URI = "modulelens://stats"
STATS_TEMPLATE = "modulelens://stats/{ref}"

INSTRUCTIONS = (
    "modulelens captures the inputs and outputs of PyTorch modules while a script runs, stores "
    "them as versioned artifacts in a repository, and replays them. Every tool here is also a "
    "`modulelens` CLI command with the same argument names. A ref is name, name:v3 (a version) or "
    "name@tag; card ids are <opset>/<index> (blk/6); candidate ids name.cardN:vM. `list` and `show` "
    "read what the repository holds, by kind. Each result is JSON (the text and the structured "
    "content are the same data); read its `warnings` before using it, and `next` suggests the calls "
    "that usually follow. Its fields are described by the resource modulelens://schemas/{tool}. A "
    "boolean argument without a default is off when left out; no number is negative, and counts and "
    "seconds are at least 1 or above 0 unless their default is 0. Long lists are cut to `top`/`limit` "
    "items: the result says how many were left out and where the rest is. Calls that may outlast "
    "your request timeout can run through start_job. Relative paths (out, source) are taken from the "
    "project folder, the one that holds the repository, never from the server's working directory. "
    + shared_arguments_text()
)


def _error_result(text: str) -> CallToolResult:
    """A tool error whose text is exactly ``text``."""
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def reply(result: BaseModel) -> CallToolResult:
    """A tool's result as the client receives it: the structured content, and the same data as
    compact JSON in the text (argument markers written as argument names)."""
    data = rendered_reply(result, "args")
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def _argument_problem(tool: Tool, arguments: dict[str, Any]) -> tuple[BaseModel | None, str | None]:
    """The request ``arguments`` make for ``tool``, or what is wrong with them (unknown names first,
    then invalid values, one line per field)."""
    unknown = unknown_names(tool.request, arguments)
    if unknown is not None:
        return None, f"invalid arguments for {tool.name}: {unknown}"
    loose = loose_booleans(tool.request, arguments)
    if loose is not None:
        return None, f"invalid arguments for {tool.name}: {loose}"
    try:
        return tool.request.model_validate(arguments), None
    except ValidationError as exc:
        return None, validation_text(exc)


class ModuleLensServer(MCPServer):
    """An MCPServer that serves a registry's tools itself: ``tools/list`` from their request
    models, and each call checked once against its request model, then run (module docstring)."""

    def __init__(self, tools: ToolRegistry, repo_root: Path | None, **kwargs: Any):
        super().__init__(**kwargs)
        self._modulelens_tools = tools
        self._repo_root = repo_root
        self._listed = [MCPTool(name=t.name, description=describe(t), input_schema=input_schema(t)) for t in tools]
        self._schemas = {t.name: t.input_schema for t in self._listed}

    async def list_tools(self) -> list[MCPTool]:
        return list(self._listed)

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        return self._schemas.get(name)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        if name not in self._modulelens_tools:
            return _error_result(f"no tool named {name!r}; tools: {', '.join(self._modulelens_tools.names())}")
        tool = self._modulelens_tools.get(name)
        request, problem = _argument_problem(tool, parse_json_text(tool.request, arguments))
        if request is None:
            return _error_result(problem or "invalid arguments")
        try:
            result = await call_tool(tool, request, self._repo_root, context)
        except ModuleLensError as exc:
            return _error_result(error_text(exc))
        if isinstance(result, InputRequiredResult):  # a sample is needed first (protocol 2026-07-28)
            return result
        return reply(result)


def _add_schema_resource(server: MCPServer, tools: ToolRegistry) -> None:
    @server.resource(
        SCHEMA_TEMPLATE,
        name="result_schema",
        description="The JSON schema of a tool's result, every field described (a model its page leaves out: TOOL.MODEL).",
        mime_type="application/json",
    )
    async def schema(tool: str) -> str:
        name, _, model = tool.partition(".")  # TOOL, or TOOL.MODEL: one model its page left out
        if name not in tools:
            raise ResourceNotFoundError(f"no tool named {name!r}; tools: {', '.join(tools.names())}")
        try:
            page = result_schema_page(tools.get(name), model or None)
        except ModuleLensError as exc:
            raise ResourceNotFoundError(error_text(exc)) from exc
        return json.dumps(page, separators=(",", ":"))


def build_server(tools: Iterable[Tool], repo_root: Path | None = None) -> MCPServer:
    """An MCP server exposing ``tools`` (those not declared ``mcp=False``), the job tools when some
    of them are long, the schema resource of their results, and the capture and statistics
    resources when ``list`` and ``show`` are among them.

    ``repo_root`` None means :func:`~modulelens.repo.default_repo_root` at each call.
    """
    served = [t for t in tools if t.mcp]
    registry = ToolRegistry([*served, *job_tools(ToolRegistry(served))])
    server = ModuleLensServer(registry, repo_root, name="modulelens", instructions=INSTRUCTIONS,
                              version=package_version())
    _add_schema_resource(server, registry)
    if "list" in registry and "show" in registry:
        listing, showing = registry.get("list"), registry.get("show")
        add_listing_resources(server, listing, showing, repo_root, uri=CAPTURES_URI, template=CAPTURE_TEMPLATE,
                              name="captures", item="capture", kinds=("captures", "capture"))
        add_listing_resources(server, listing, showing, repo_root, uri=STATS_URI, template=STATS_TEMPLATE,
                              name="stats", item="statistics run", kinds=("stats", "stats"))
    return server


def run_stdio(repo_root: Path | None = None) -> None:
    """Serve every registered tool over stdio. mcp's stdio transport moves fd 1 to stderr while it
    serves the protocol from a private duplicate, so a stray print cannot corrupt the wire."""
    server = build_server(all_tools(), repo_root)
    server.run("stdio")
