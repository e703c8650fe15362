"""What every tool result carries for the one who reads it: the warnings to act on and the calls
that usually come next.

A leaf module (pydantic and :mod:`modulelens.errors` only), so that any result model, in any package, can inherit
:class:`ToolReply`. ``warnings`` are plain sentences; they may hold argument markers
(``[--limit N]``) and suggested calls (``tool_call``, see :mod:`modulelens.errors`) that each front
end writes its own way. ``next``
holds typed calls (:class:`NextCall`): the MCP server shows them as tool names and arguments, the
CLI as command lines with its option names.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from modulelens.errors import CallWriter, Front, render

__all__ = ["NextCall", "ToolReply", "call", "rendered_reply"]


class NextCall(BaseModel):
    """A suggested call: a tool and its arguments (request field names)."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)


def call(tool: str, **arguments: Any) -> NextCall:
    """``NextCall(tool, arguments)``, arguments left None dropped."""
    return NextCall(tool=tool, arguments={k: v for k, v in arguments.items() if v is not None})


class ToolReply(BaseModel):
    """The base of every tool result: ``warnings`` (what could mislead if unread: flags, timings
    that were not determined, kernels that never ran, data that is only shapes, protection not in
    force, entries left unused and why) and ``next`` (one or two calls that usually follow).
    A result model that extends a domain record lists the record first and this last, so these
    two fields come first in the JSON."""

    warnings: list[str] = Field(default_factory=list, description="Read before using the result.")
    next: list[NextCall] = Field(default_factory=list, description="Calls that usually follow.")


def rendered_reply(result: BaseModel, front: Front, calls: CallWriter | None = None) -> dict[str, Any]:
    """``result`` as JSON data, the markers of its ``warnings`` and of its ``left_out`` pointers
    written for ``front`` (calls by ``calls``, see :func:`modulelens.errors.render`); the rest of
    the data is the tool's, left as it is."""
    data = result.model_dump(mode="json")
    if isinstance(data.get("warnings"), list):
        data["warnings"] = [render(w, front, calls) if isinstance(w, str) else w for w in data["warnings"]]
    for cut in data.get("left_out") or []:
        if isinstance(cut, dict) and isinstance(cut.get("full"), str):
            cut["full"] = render(cut["full"], front, calls)
    return data
