"""The one registry of tools.

Every capability is a :class:`Tool`: a name, a pydantic request model, a pydantic result model
(or a union of them) and a plain function ``fn(request, ctx) -> result``. A tool is declared once,
with :func:`tool` over its typed function::

    @tool
    def tag_capture(req: TagCaptureRequest, ctx: ToolContext) -> TagCaptureResult:
        \"\"\"Point a tag at one version of a capture (name@tag).\"\"\"

The name is the function's (a trailing underscore, PEP 8's way around a builtin, is dropped:
``list_`` is ``list``), the summary is the first paragraph of its docstring, and the request and
result models are its annotations. Declaring registers nothing: a :class:`ToolRegistry` is built
from an explicit list (:func:`modulelens.tools.all_tools`) and handed to the front ends (MCP
server, CLI, UI), which are generated from it, so argument names match everywhere.
"""

from __future__ import annotations

import inspect
import threading
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from modulelens.callbacks import ProgressFn, SampleFn
from modulelens.errors import ModuleLensError
from modulelens.paths import project_folder
from modulelens.replies import ToolReply
from modulelens.repo import default_repo_root, remove_stale_tmp

Req = TypeVar("Req", bound=BaseModel)
Res = TypeVar("Res", bound=BaseModel)


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
    # Set by a front end that cancels the call (MCP cancellation, a cancelled job). Worker processes
    # see it through modulelens.cancellation (the front end runs the tool inside ``cancellable``).
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Where relative paths of a request are taken from, and the project a source may be read from
    # without ``allow_outside``: the CLI and the Python API set the working directory; None (MCP,
    # its jobs, the UI) means the folder that holds the repository (see modulelens.paths).
    workdir: Path | None = None

    @property
    def paths_typed_by_person(self) -> bool:
        """Whether the request's paths were typed by a person (the CLI, the Python API: ``workdir``
        set), who may read a source from anywhere; not where an agent or a web page sends them
        (MCP, its jobs, the UI), where a source outside the project needs ``allow_outside``."""
        return self.workdir is not None

    @property
    def person_reads_stderr(self) -> bool:
        """Whether a person watches this process's stderr, where a worker's output is relayed (the
        CLI, the Python API: ``workdir`` set); not over MCP, its jobs or the UI, whose clients see
        only what the call reports."""
        return self.workdir is not None

    @property
    def project(self) -> Path:
        """The project folder of this call (``workdir``, else the folder holding the repository)."""
        return Path(self.workdir).absolute() if self.workdir is not None else project_folder(self.repo_root)

    def __post_init__(self) -> None:
        # Every front end makes one context per tool call: the temporary folders that killed writers
        # (a capture killed mid-write: hundreds of MB) left in the repository go now, whatever the
        # tool, not only at the next write.
        remove_stale_tmp(Path(self.repo_root))


@dataclass(frozen=True)
class Tool(Generic[Req, Res]):
    name: str
    request: type[Req]
    result: Any  # a result model, or a union of result models (see ``result_models``)
    fn: Callable[[Req, ToolContext], Res]
    summary: str
    # Optional human renderer for the CLI: result -> rich renderable. None uses a generic table.
    render: Callable[[Res], object] | None = None
    # False for a tool people run but agents never need over MCP (it sets MCP up, for one).
    mcp: bool = True

    @property
    def cli_name(self) -> str:
        return self.name.replace("_", "-")

    @property
    def result_models(self) -> tuple[type[BaseModel], ...]:
        """The result model, or each model of a union of them."""
        return _models(self.result)

    def __call__(self, request: Req, ctx: ToolContext | None = None) -> Res:
        return self.fn(request, ctx or ToolContext())


def _models(annotation: Any) -> tuple[type[BaseModel], ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(m for a in typing.get_args(annotation) for m in _models(a))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return (annotation,)
    raise TypeError(f"{annotation!r} is not a pydantic model or a union of them")


def _summary(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn)
    if not doc:
        raise TypeError(f"tool {fn.__name__!r} needs a docstring: its first paragraph is the summary")
    return " ".join(doc.split("\n\n", 1)[0].split())


def tool(fn: Callable[..., Any] | None = None, *, render: Callable[[Any], object] | None = None,
         mcp: bool = True) -> Any:
    """Declare ``fn(req: Request, ctx: ToolContext) -> Result`` a :class:`Tool` (module docstring).

    Every model of the result must extend :class:`~modulelens.replies.ToolReply` (``warnings``
    and ``next``). Used bare (``@tool``) or with options (``@tool(mcp=False)``)."""

    def declare(f: Callable[..., Any]) -> Tool:
        try:
            hints = typing.get_type_hints(f)
        except NameError as exc:
            raise TypeError(f"tool {f.__name__!r}: its annotations cannot be resolved ({exc}); declare its models "
                            "at module level") from None
        params = list(inspect.signature(f).parameters)
        if len(params) != 2 or "return" not in hints or params[0] not in hints:
            raise TypeError(f"tool {f.__name__!r} must be typed as fn(req: Request, ctx: ToolContext) -> Result")
        request, result = hints[params[0]], hints["return"]
        if not (isinstance(request, type) and issubclass(request, BaseModel)):
            raise TypeError(f"tool {f.__name__!r}: its request {request!r} is not a pydantic model")
        for model in _models(result):
            if not issubclass(model, ToolReply):
                raise TypeError(f"tool {f.__name__!r}: its result {model.__name__} does not extend ToolReply")
        return Tool(f.__name__.removesuffix("_"), request, result, f, _summary(f), render=render, mcp=mcp)

    return declare if fn is None else declare(fn)


class ToolRegistry:
    """Tools by name, in a fixed order (the CLI's and the MCP server's); a name is there once."""

    def __init__(self, tools: Iterable[Tool] = ()):
        self._tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self._tools:
                raise ValueError(f"tool {t.name!r} given twice")
            self._tools[t.name] = t

    def get(self, name: str) -> Tool:
        """The tool called ``name``; a clear error names the known ones otherwise."""
        found = self._tools.get(name)
        if found is None:
            raise ModuleLensError(f"no tool named {name!r}", f"tools: {', '.join(self._tools)}")
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)
