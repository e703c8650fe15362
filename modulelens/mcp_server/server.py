"""The MCP server, generated from a list of tools.

Each :class:`~modulelens.registry.Tool` becomes one MCP tool with the same name. Its input schema
is the request model's fields as flat arguments (same names as the CLI options, with underscores),
compacted; the result model is returned as structured content, with a one-line summary as text
(:mod:`modulelens.mcp_server.summary`). ``tools/list`` stays small: it publishes no output
schema; the resource ``modulelens://schemas/{tool}`` is the result model's full
schema with every field described (see :mod:`modulelens.mcp_server.schema`). Arguments are checked strictly before
the call: unknown names are refused with the valid ones and a did-you-mean, and type or value
errors come back one line per field (:mod:`modulelens.arguments`). The tool function runs in a
worker thread so the event loop keeps serving; ``ToolContext.progress`` is forwarded as MCP
progress notifications. A :class:`~modulelens.errors.ModuleLensError` becomes a tool error result
(``is_error``) whose text holds the message and the hint, arguments named as tool arguments.

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
import json
import logging
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.server.mcpserver.tools.base import Tool as MCPTool
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from pydantic import ValidationError

from modulelens.arguments import unknown_names
from modulelens.errors import ModuleLensError
from modulelens.mcp_server.calls import call_tool, error_text, validation_text
from modulelens.mcp_server.jobs import job_tools
from modulelens.mcp_server.resources import add_listing_resources
from modulelens.mcp_server.schema import (
    SCHEMA_TEMPLATE,
    compact_schema,
    context_name,
    describe,
    parameter,
    result_schema,
    shared_arguments_text,
    without_shared_descriptions,
)
from modulelens.mcp_server.summary import result_summary
from modulelens.registry import Tool
from modulelens.tools import all_tools
from modulelens.version import package_version

__all__ = ["CAPTURES_URI", "CAPTURE_TEMPLATE", "SCHEMA_TEMPLATE", "build_server", "run_stdio"]

logger = logging.getLogger(__name__)

CAPTURES_URI = "modulelens://captures"
CAPTURE_TEMPLATE = "modulelens://captures/{ref}"
STATS_URI = "modulelens://stats"
STATS_TEMPLATE = "modulelens://stats/{ref}"

INSTRUCTIONS = (
    "modulelens captures the inputs and outputs of PyTorch modules while a script runs, stores "
    "them as versioned artifacts in a repository, and replays them. Every tool here is also a "
    "`modulelens` CLI command with the same argument names. A ref is name, name:v3 (a version) or "
    "name@tag; card ids are <opset>/<index> (blk/6); candidate ids name.cardN:vM. Each result is "
    "structured content (with a one-line text summary); its fields are described by the resource "
    "modulelens://schemas/{tool}. A boolean argument without a default is off when left out. Long "
    "lists are cut to `top`/`limit` items: the result says how many were left out and where the "
    "rest is. Calls that may outlast your request timeout can run through start_job. "
    + shared_arguments_text()
)


def _error_result(text: str) -> CallToolResult:
    """A tool error whose text is exactly ``text`` (a raised ToolError would get the SDK's
    "Error executing tool NAME:" in front)."""
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _make_handler(tool: Tool, repo_root: Path | None) -> Any:
    fields = dict(tool.request.model_fields)
    ctx_name = context_name(fields)
    params = [parameter(name, field) for name, field in fields.items()]

    async def handler(**kwargs: Any) -> CallToolResult:
        ctx = kwargs.pop(ctx_name, None)
        try:
            request = tool.request.model_validate(kwargs)
        except ValidationError as exc:
            return _error_result(validation_text(exc))
        try:
            result = await call_tool(tool, request, repo_root, ctx)
        except ModuleLensError as exc:
            return _error_result(error_text(exc))
        if isinstance(result, InputRequiredResult):  # a sample is needed first (protocol 2026-07-28)
            return result
        return CallToolResult(content=[TextContent(type="text", text=result_summary(tool.name, result))],
                              structured_content=result.model_dump(mode="json"))

    ctx_param = inspect.Parameter(
        ctx_name, inspect.Parameter.KEYWORD_ONLY, annotation=Context
    )
    handler.__name__ = tool.name
    handler.__qualname__ = tool.name
    handler.__doc__ = tool.summary
    # MCP reads the signature for the arguments and typing.get_type_hints() for the context
    # parameter and the return type: both must be set.
    signature = inspect.Signature([*params, ctx_param], return_annotation=CallToolResult)
    handler.__signature__ = signature  # type: ignore[attr-defined]
    handler.__annotations__ = {p.name: p.annotation for p in params} | {
        ctx_name: Context,
        "return": CallToolResult,
    }
    return handler


def _mcp_tool(tool: Tool, repo_root: Path | None) -> MCPTool:
    """``tool`` as the SDK's tool: its summary and compacted input schema. The handler returns its
    own CallToolResult (structured content + summary), with no output schema in ``tools/list``."""
    built = MCPTool.from_function(_make_handler(tool, repo_root), name=tool.name, description=describe(tool))
    return built.model_copy(update={"parameters": without_shared_descriptions(compact_schema(built.parameters))})


class ModuleLensServer(MCPServer):
    """An MCPServer that checks a call's arguments against the tool's request model first:
    unknown names and invalid values are refused with one line per problem (a tool error)."""

    def __init__(self, tools: dict[str, Tool], sdk_tools: list[MCPTool], **kwargs: Any):
        super().__init__(tools=sdk_tools, **kwargs)
        self._modulelens_tools = tools
        self._metadata = {t.name: t.fn_metadata for t in sdk_tools}

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        tool = self._modulelens_tools.get(name)
        if tool is not None:
            problem = _argument_problem(tool, self._metadata[name].pre_parse_json(arguments))
            if problem is not None:
                raise ToolError(problem)
        return await super().call_tool(name, arguments, context)


def _argument_problem(tool: Tool, arguments: dict[str, Any]) -> str | None:
    """What is wrong with ``arguments`` for ``tool`` (unknown names first, then invalid values, one
    line per field), or None. Lists and objects sent as JSON text must be parsed already."""
    unknown = unknown_names(tool.request, arguments)
    if unknown is not None:
        return f"invalid arguments for {tool.name}: {unknown}"
    try:
        tool.request.model_validate(arguments)
    except ValidationError as exc:
        return validation_text(exc)
    return None


def _add_schema_resource(server: MCPServer, by_name: dict[str, Tool]) -> None:
    @server.resource(
        SCHEMA_TEMPLATE,
        name="result_schema",
        description="The JSON schema of a tool's result, every field described.",
        mime_type="application/json",
    )
    async def schema(tool: str) -> str:
        if tool not in by_name:
            raise ResourceNotFoundError(f"no tool named {tool!r}; tools: {', '.join(by_name)}")
        return json.dumps(result_schema(by_name[tool]), separators=(",", ":"))


def build_server(tools: list[Tool], repo_root: Path | None = None) -> MCPServer:
    """An MCP server exposing ``tools``, the schema resource of their results, and the capture
    and statistics resources when those tools are present.

    ``repo_root`` None means :func:`~modulelens.registry.default_repo_root` at each call.
    """
    by_name: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in by_name:
            raise ValueError(f"tool {tool.name!r} given twice")
        by_name[tool.name] = tool
    for tool in job_tools(by_name):
        by_name[tool.name] = tool
    server = ModuleLensServer(by_name, [_mcp_tool(tool, repo_root) for tool in by_name.values()], name="modulelens",
                              instructions=INSTRUCTIONS, version=package_version())
    _add_schema_resource(server, by_name)
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
