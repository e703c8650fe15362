"""How a registry tool looks to an MCP client: its description, its arguments and its result.

The input schema is the request model's JSON schema: its fields as flat arguments (same names as
the CLI options, with underscores), compacted (:func:`compact_schema`). ``tools/list`` must stay small for agents (every tool's schemas are read
into the model's context), so it publishes no output schema: the result model's full schema, every
field described, is the resource ``modulelens://schemas/{tool}`` (:func:`result_schema`), named
once in the server's instructions.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from modulelens.errors import ModuleLensError, render
from modulelens.listing import MAX_REPLY_CHARS, LeftOut
from modulelens.registry import Tool

SCHEMA_TEMPLATE = "modulelens://schemas/{tool}"
# One model of a tool's result schema (a ``$defs`` entry the tool's page left out): the template's
# ``tool`` written as ``TOOL.MODEL`` (tool names hold no dot).
SCHEMA_MODEL_URI = "modulelens://schemas/{tool}.{model}"


def describe(tool: Tool) -> str:
    """The tool description: its summary (the arguments are described in the input schema), with
    argument markers written as argument names."""
    return render(tool.summary.strip(), "args")


def _without_null(alternatives: list[Any]) -> dict[str, Any] | None:
    """The one alternative of ``[X, {"type": "null"}]`` that is not null, else None."""
    rest = [a for a in alternatives if a != {"type": "null"}]
    return rest[0] if len(alternatives) == 2 and len(rest) == 1 and isinstance(rest[0], dict) else None


def _nullable(other: dict[str, Any]) -> dict[str, Any] | None:
    """``other`` (one alternative of ``anyOf [other, null]``) with ``null`` added to its type, when
    it has one simple type (its other keywords, e.g. ``minimum``, only constrain that type)."""
    kind = other.get("type")
    return {**other, "type": [kind, "null"]} if isinstance(kind, str) and "enum" not in other else None


def compact_schema(node: Any) -> Any:
    """A JSON schema without what restates other parts of it: ``title`` (the property's own name,
    capitalised), ``type`` next to an ``enum`` of strings, ``default: null`` with the null
    alternative of ``anyOf [X, null]`` (an optional argument left out is None), and
    ``anyOf [X, null]`` written as X with ``"type": [t, "null"]``, ``default: false`` of a
    boolean (a flag left out is off), ``additionalProperties: true`` (the default), and lower bounds of 0 or 1 (no number is negative, counts
    start at 1: the server instructions say so once; the request model still checks them).
    Descriptions, other defaults and constraints are kept."""
    if isinstance(node, list):
        return [compact_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: compact_schema(sub) for name, sub in value.items()}
        else:
            out[key] = compact_schema(value)
    if out.get("additionalProperties") is True:
        del out["additionalProperties"]  # what JSON schema assumes anyway
    if out.get("type") == "boolean" and out.get("default") is False:
        del out["default"]  # a flag left out is off (the server instructions say so)
    if out.get("minimum") in (0, 1) and not isinstance(out.get("minimum"), bool):
        del out["minimum"]  # no number is negative; counts start at 1 (the instructions say so)
    if out.get("exclusiveMinimum") == 0 and not isinstance(out.get("exclusiveMinimum"), bool):
        del out["exclusiveMinimum"]
    if out.get("type") == "string" and all(isinstance(v, str) for v in out.get("enum", [None])):
        del out["type"]
    other = _without_null(out.get("anyOf", []))
    if other is not None:
        if "default" in out and out["default"] is None:
            del out["anyOf"], out["default"]
            out = {**other, **out}
        elif (nullable := _nullable(other)) is not None:
            del out["anyOf"]
            out = {**nullable, **out}
    return out


# Arguments that mean the same in every tool that has them: their description is said once, in
# the server's instructions (``shared_arguments_text``), instead of in every input schema.
SHARED_ARGUMENTS: dict[str, str] = {
    "ref": "Capture ref.",
    "candidate": "Candidate id (blk.card6:v1).",
    "card": "Card id (blk/6).",
    "job": "Job id from start_job.",
    "limit": "Entries listed.",
    "top": "Items listed per list; all are stored.",
    "rtol": "Default: per dtype.",
    "atol": "Default: per dtype.",
    "timeout": "Seconds.",
    "device": "Default: the captured one.",
    "nproc": "Processes under torchrun.",
    "seeds": "Fresh adversarial input seeds.",
    "compile_baseline": "Also time torch.compile.",
    "source": "Or: your source file.",
    "source_text": "Or: the source itself.",
    "allow_outside": "Read or write a path outside the project and the repository.",
    "allow_env_mismatch": "Allow another torch, device or compiler.",
    "name": "Only this name's versions.",
    "pack": "Pack file or stored pack NAME[:vN].",
    "force": "Use entries even when not surely faster than eager.",
    "mechanism": "How calls reach the pack's kernels: library (default; kernels for the packed operators only, "
                 "cheaper) or mode (a dispatch mode that sees every aten call).",
}


def shared_arguments_text() -> str:
    """The instructions' sentence on the shared arguments."""
    items = "; ".join(f"{name}: {text.rstrip('.')}" for name, text in SHARED_ARGUMENTS.items())
    return f"Arguments shown without a description mean the same in every tool: {items}."


def without_shared_descriptions(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (a tool's input schema) without the descriptions of shared arguments whose text
    is exactly the shared one (a tool that means something else by the name keeps its own)."""
    properties = {}
    for name, prop in schema.get("properties", {}).items():
        if isinstance(prop, dict) and prop.get("description") == SHARED_ARGUMENTS.get(name):
            prop = {k: v for k, v in prop.items() if k != "description"}
        properties[name] = prop
    return {**schema, "properties": properties} if "properties" in schema else schema


def result_schema(tool: Tool) -> dict[str, Any]:
    """The full JSON schema of ``tool``'s result (for a union of result models, ``anyOf`` them),
    every field described (compacted), argument markers in descriptions written as argument names."""
    schema = TypeAdapter(tool.result).json_schema()
    return json.loads(render(json.dumps(compact_schema(schema)), "args"))


def input_schema(tool: Tool) -> dict[str, Any]:
    """The input schema of ``tool``: its request model's fields as flat arguments, compacted, the
    CLI's marker dropped, argument markers in descriptions written as argument names, and shared
    arguments without their description (the instructions say it once)."""
    schema = tool.request.model_json_schema()
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict) and prop.get("cli") == "argument":
            del prop["cli"]
    schema = json.loads(render(json.dumps(schema), "args"))
    return without_shared_descriptions(compact_schema(schema))


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def result_schema_page(tool: Tool, model: str | None = None) -> dict[str, Any]:
    """What the schema resource serves, within ``MAX_REPLY_CHARS``: for ``model`` None, the
    result schema of ``tool`` (:func:`result_schema`) with as many of its ``$defs`` as fit,
    smallest first, and a ``left_out`` entry for each one left out, naming its own page
    (:data:`SCHEMA_MODEL_URI`); for a ``model``, that ``$defs`` entry alone (its references name
    other entries, each with its page)."""
    schema = result_schema(tool)
    defs: dict[str, Any] = schema.pop("$defs", {})
    if model is not None:
        if model not in defs:
            raise ModuleLensError(f"the result schema of {tool.name} has no model {model!r}",
                                  f"its models: {', '.join(sorted(defs)) or 'none'}")
        return defs[model]
    kept: dict[str, Any] = {}
    left_out: list[dict[str, Any]] = []
    room = MAX_REPLY_CHARS - _size(schema) - 200 * len(defs)  # each left_out entry takes under 200 characters
    for name in sorted(defs, key=lambda n: (_size(defs[n]), n)):
        if _size(defs[name]) + len(name) + 4 <= room:
            kept[name] = defs[name]
            room -= _size(defs[name]) + len(name) + 4
        else:
            cut = LeftOut(field=f"$defs.{name}", shown=0, total=1,
                          full=SCHEMA_MODEL_URI.format(tool=tool.name, model=name))
            left_out.append(cut.model_dump())
    page = {**schema, "$defs": dict(sorted(kept.items()))} if kept else schema
    return {**page, "left_out": left_out} if left_out else page
