"""How a registry tool looks to an MCP client: its description and its arguments.

The input schema is the request model's fields as flat keyword arguments (same names as the CLI
options, with underscores), built as a handler signature that the MCP SDK reads.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from pydantic import Field
from pydantic.fields import FieldInfo

from modulelens.registry import Tool


def describe(tool: Tool) -> str:
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


def parameter(name: str, field: FieldInfo) -> inspect.Parameter:
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


def context_name(fields: dict[str, FieldInfo]) -> str:
    name = "ctx"
    while name in fields:
        name = "mcp_" + name
    return name
