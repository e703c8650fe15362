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
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import (
    ResourceError,
    ResourceNotFoundError,
    ToolError,
)
from mcp.server.mcpserver.resources.templates import ResourceSecurity
from pydantic import BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo

from modulelens.errors import ModuleLensError, ReferenceNotFound
from modulelens.registry import Tool, ToolContext
from modulelens.repo import default_repo_root
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


def _error_text(exc: ModuleLensError) -> str:
    text = f"{type(exc).__name__}: {exc.message}"
    return f"{text}\nhint: {exc.hint}" if exc.hint else text


def _validation_text(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc") or ())
        parts.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
    return "invalid arguments: " + "; ".join(parts)


def _describe(tool: Tool) -> str:
    """The tool description: its summary, then one line per argument."""
    lines = [tool.summary.strip()]
    fields = tool.request.model_fields
    if fields:
        lines += ["", "Arguments:"]
        for name, field in fields.items():
            doc = f" {field.description}" if field.description else ""
            required = " (required)" if field.is_required() else ""
            lines.append(f"- {name}{required}:{doc}")
    return "\n".join(lines)


def _schema_extra(field: FieldInfo) -> dict[str, Any] | None:
    extra = field.json_schema_extra
    if not isinstance(extra, dict):
        return None
    extra = {
        k: v for k, v in extra.items() if k != "cli"
    }  # the CLI marker means nothing here
    return extra or None


def _parameter(name: str, field: FieldInfo) -> inspect.Parameter:
    """A keyword-only parameter ``name: Annotated[type, *constraints, Field(...)] = default``."""
    field_kwargs: dict[str, Any] = {"description": field.description}
    if field.title is not None:
        field_kwargs["title"] = field.title
    if field.examples is not None:
        field_kwargs["examples"] = field.examples
    if (extra := _schema_extra(field)) is not None:
        field_kwargs["json_schema_extra"] = extra
    default: Any = inspect.Parameter.empty
    if field.default_factory is not None:
        field_kwargs["default_factory"] = field.default_factory
    elif not field.is_required():
        default = field.default
    annotation = Annotated[(field.annotation, *field.metadata, Field(**field_kwargs))]  # type: ignore[misc]
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def _context_name(fields: dict[str, FieldInfo]) -> str:
    name = "ctx"
    while name in fields:
        name = "mcp_" + name
    return name


async def _call(
    tool: Tool, request: BaseModel, repo_root: Path | None, ctx: Context | None
) -> BaseModel:
    """Run ``tool.fn`` in a worker thread, forwarding its progress to ``ctx``."""
    token = anyio.lowlevel.current_token()

    def progress(
        done: float, total: float | None = None, message: str | None = None
    ) -> None:
        if ctx is None:
            return
        try:
            anyio.from_thread.run(
                ctx.report_progress,
                float(done),
                None if total is None else float(total),
                message,
                token=token,
            )
        except Exception:  # progress must never break a tool
            logger.debug("could not report progress for %s", tool.name, exc_info=True)

    def sample(system: str, user: str, max_tokens: int) -> tuple[str, str]:
        from modulelens.providers.sampling import sample_via_mcp

        return anyio.from_thread.run(sample_via_mcp, ctx, system, user, max_tokens, token=token)

    tool_ctx = ToolContext(
        repo_root=repo_root if repo_root is not None else default_repo_root(),
        progress=progress,
        stdout_is_protocol=True,
        sample=sample if ctx is not None else None,
    )
    return await anyio.to_thread.run_sync(tool.fn, request, tool_ctx)


def _make_handler(tool: Tool, repo_root: Path | None) -> Any:
    fields = dict(tool.request.model_fields)
    ctx_name = _context_name(fields)
    params = [_parameter(name, field) for name, field in fields.items()]

    async def handler(**kwargs: Any) -> BaseModel:
        ctx = kwargs.pop(ctx_name, None)
        try:
            request = tool.request.model_validate(kwargs)
        except ValidationError as exc:
            raise ToolError(_validation_text(exc)) from exc
        try:
            return await _call(tool, request, repo_root, ctx)
        except ModuleLensError as exc:
            raise ToolError(_error_text(exc)) from exc

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


def _add_listing_resources(
    server: MCPServer, list_tool: Tool, show_tool: Tool, repo_root: Path | None, *,
    uri: str, template: str, name: str, item: str, ref_field: str,
) -> None:
    """Two resources over a list tool (``uri``, called with its defaults) and a show tool
    (``template``, its ``ref_field`` set to the template's ``ref``), as JSON."""

    async def read(tool: Tool, request_data: dict[str, Any]) -> str:
        try:
            request = tool.request.model_validate(request_data)
            result = await _call(tool, request, repo_root, None)
        except ReferenceNotFound as exc:
            raise ResourceNotFoundError(_error_text(exc)) from exc
        except ModuleLensError as exc:
            raise ResourceError(_error_text(exc)) from exc
        except ValidationError as exc:
            raise ResourceError(_validation_text(exc)) from exc
        return result.model_dump_json(indent=2)

    @server.resource(
        uri,
        name=name,
        description=f"Every {item} in the repository ({list_tool.name} with its defaults), as JSON.",
        mime_type="application/json",
    )
    async def listing() -> str:
        return await read(list_tool, {})

    # The default ResourceSecurity rejects values that look like absolute paths, and a one-letter
    # name with a version ("a:v2") looks like a Windows drive ("a:"). Refs are validated by the
    # repository itself (InvalidName), exactly as when the show tool is called as a tool.
    @server.resource(
        template,
        name=item.replace(" ", "_"),
        description=f"One {item} ({show_tool.name} for ref, e.g. enc0, enc0:v2, enc0@prod), as JSON.",
        mime_type="application/json",
        security=ResourceSecurity(exempt_params={"ref"}),
    )
    async def one(ref: str) -> str:
        return await read(show_tool, {ref_field: ref})


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
            description=_describe(tool),
            structured_output=True,
        )
    if "list_captures" in by_name and "show_capture" in by_name:
        _add_listing_resources(
            server, by_name["list_captures"], by_name["show_capture"], repo_root,
            uri=CAPTURES_URI, template=CAPTURE_TEMPLATE, name="captures", item="capture", ref_field="ref",
        )
    if "list_stats_runs" in by_name and "show_stats_run" in by_name:
        _add_listing_resources(
            server, by_name["list_stats_runs"], by_name["show_stats_run"], repo_root,
            uri=STATS_URI, template=STATS_TEMPLATE, name="stats", item="statistics run", ref_field="run",
        )
    return server


def run_stdio(repo_root: Path | None = None) -> None:
    """Serve every registered tool over stdio. mcp's stdio transport moves fd 1 to stderr while it
    serves the protocol from a private duplicate, so a stray print cannot corrupt the wire."""
    server = build_server(all_tools(), repo_root)
    server.run("stdio")
