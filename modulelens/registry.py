"""The one registry of tools.

Every capability is a :class:`Tool`: a name, a pydantic request model, a pydantic result model
and a plain function ``fn(request, ctx) -> result``. The MCP server and the CLI are generated from
this list, so a tool cannot exist in one front end and not the other, and argument names match.

The registry knows no tool: each module of :mod:`modulelens.tools` registers itself on import, and
:func:`modulelens.tools.all_tools` is the one place that imports them all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel

from modulelens.repo import default_repo_root
from modulelens.repo.store import remove_stale_tmp

Req = TypeVar("Req", bound=BaseModel)
Res = TypeVar("Res", bound=BaseModel)

ProgressFn = Callable[[float, float | None, str | None], None]
# (system prompt, user prompt, max tokens) -> (reply text, model name), via MCP sampling.
SampleFn = Callable[[str, str, int], tuple[str, str]]


@dataclass
class ToolContext:
    """What a tool function may use besides its request: where the repository is, and a way to
    report progress (a no-op outside MCP/CLI progress displays)."""

    repo_root: Path = field(default_factory=default_repo_root)
    progress: ProgressFn = lambda done, total=None, message=None: None
    # True when stdout is a protocol wire (MCP stdio): tools must not let user code print there.
    stdout_is_protocol: bool = False
    # Set by the MCP server when the connected client can sample: asks the client's own model.
    sample: SampleFn | None = None
    # Set by a front end that cancels the call (MCP cancellation, cancel_job). Worker processes
    # see it through modulelens.cancellation (the front end runs the tool inside ``cancellable``).
    cancelled: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        # Every front end makes one context per tool call: the temporary folders that killed writers
        # (a capture killed mid-write: hundreds of MB) left in the repository go now, whatever the
        # tool, not only at the next write.
        remove_stale_tmp(Path(self.repo_root))


@dataclass(frozen=True)
class Tool(Generic[Req, Res]):
    name: str
    request: type[Req]
    result: type[Res]
    fn: Callable[[Req, ToolContext], Res]
    summary: str
    # Optional human renderer for the CLI: result -> rich renderable. None uses a generic table.
    render: Callable[[Res], object] | None = None

    @property
    def cli_name(self) -> str:
        return self.name.replace("_", "-")

    def __call__(self, request: Req, ctx: ToolContext | None = None) -> Res:
        return self.fn(request, ctx or ToolContext())


_TOOLS: dict[str, Tool] = {}


def register(tool: Tool) -> Tool:
    if tool.name in _TOOLS:
        raise ValueError(f"tool {tool.name!r} registered twice")
    _TOOLS[tool.name] = tool
    return tool


def registered() -> list[Tool]:
    """The tools registered so far, in registration order."""
    return list(_TOOLS.values())
