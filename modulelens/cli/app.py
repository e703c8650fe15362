"""The ``modulelens`` command line, generated from a list of tools.

Each :class:`~modulelens.registry.Tool` becomes one command named ``tool.cli_name``. Its options
come from the request model's fields: ``max_tensor_bytes`` becomes ``--max-tensor-bytes`` (the
same names the MCP server uses, with dashes). A field whose ``json_schema_extra`` holds
``{"cli": "argument"}`` is a positional argument instead; a ``list[str]`` argument is variadic,
and everything after ``--`` lands in it::

    modulelens capture-module train.py --module blocks.1 -- --steps 3

Every command also takes ``--repo DIR`` and ``--json``. Only values given on the command line are
passed to the request model, so the model's own defaults (and default factories) always apply.
The front end holds no logic of its own: it builds the request, calls ``tool.fn`` and shows the
result (``tool.render`` or a generic table), or the error with its hint (exit code 2).
"""

from __future__ import annotations

import collections.abc
import enum
import inspect
import json
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, NoReturn, Self, Union, get_args, get_origin

import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from modulelens.errors import ModuleLensError
from modulelens.registry import Tool, ToolContext
from modulelens.repo import default_repo_root
from modulelens.tools import all_tools
from modulelens.version import package_version

__all__ = ["build_app", "generic_render", "get_app", "is_argument_field", "main"]

EXIT_USER_ERROR = 2

# Python names of the options every command has; not valid field names (see _RESERVED_FIELDS).
_REPO_PARAM = "ml_repo_"
_JSON_PARAM = "ml_json_"
_CTX_PARAM = "ml_ctx_"
_RESERVED_FIELDS = {"repo", "json", "help", _REPO_PARAM, _JSON_PARAM, _CTX_PARAM}
_EXTRA_COMMANDS = {"mcp", "version"}


# --------------------------------------------------------------------------------------------
# Field -> click parameter
# --------------------------------------------------------------------------------------------


def is_argument_field(field: FieldInfo) -> bool:
    """True when the field is marked ``json_schema_extra={"cli": "argument"}`` (positional)."""
    extra = field.json_schema_extra
    return isinstance(extra, dict) and extra.get("cli") == "argument"


@dataclass(frozen=True)
class _CliType:
    annotation: Any  # the type typer sees (typer turns Literal and Enum into choices)
    convert: Callable[[Any], Any] | None = None  # applied to each parsed value
    is_list: bool = False
    is_bool: bool = False
    metavar: str | None = None


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            tp = args[0]
    if get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _json_or_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _scalar_cli_type(tp: Any) -> _CliType | None:
    tp = _strip_optional(tp)
    if tp is bool:
        return _CliType(bool, is_bool=True)
    if tp in (str, int, float):
        return _CliType(tp)
    if isinstance(tp, type) and issubclass(tp, PurePath):
        return _CliType(Path)
    if get_origin(tp) is Literal or (
        isinstance(tp, type) and issubclass(tp, enum.Enum)
    ):
        return _CliType(tp)
    return None


def _cli_type(annotation: Any) -> _CliType:
    tp = _strip_optional(annotation)
    origin = get_origin(tp)
    if origin in (
        list,
        set,
        frozenset,
        tuple,
        collections.abc.Sequence,
        collections.abc.Set,
    ):
        args = get_args(tp)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            args = ()  # fixed-length tuples: given as JSON below
            inner = None
        else:
            inner = _scalar_cli_type(args[0]) if args else _CliType(str)
        if inner is not None and not inner.is_bool:
            return _CliType(list[inner.annotation], inner.convert, is_list=True)
    scalar = _scalar_cli_type(tp)
    if scalar is not None:
        return scalar
    # Anything else (nested models, dicts, ...) is given as JSON text.
    return _CliType(str, convert=_json_or_text, metavar="JSON")


def _is_simple(value: Any) -> bool:
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(
            _is_simple(v) and not isinstance(v, (list, tuple, set, frozenset))
            for v in value
        )
    return value is None or isinstance(
        value, (str, int, float, bool, enum.Enum, PurePath)
    )


def _cli_default(field: FieldInfo, kind: _CliType) -> tuple[Any, str | bool]:
    """The default typer shows in ``--help`` and its ``show_default``. Only for display: a value
    not given on the command line is left out of the request, so the model's own default applies."""
    if field.is_required():
        return ..., False
    try:
        value = field.get_default(call_default_factory=True, validated_data={})
    except Exception:  # noqa: BLE001  (a factory that needs other fields: nothing to show)
        return None, False
    if isinstance(value, (set, frozenset, tuple)):
        value = list(value)
    if value == {}:
        return None, False
    if (
        _is_simple(value)
        and kind.metavar != "JSON"
        and kind.is_list == isinstance(value, list)
    ):
        return value, value is not None and value != []
    if isinstance(value, BaseModel):
        return None, value.model_dump_json()
    try:
        return None, json.dumps(value, default=str)
    except (TypeError, ValueError):
        return None, False


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    kind: _CliType
    is_argument: bool
    label: str  # how errors name it: "--max-tensor-bytes" or "argument script"


def _field_parameter(
    name: str, field: FieldInfo
) -> tuple[inspect.Parameter, _FieldSpec]:
    kind = _cli_type(field.annotation)
    dashed = name.replace("_", "-")
    default, show_default = _cli_default(field, kind)
    help_text = escape(field.description) if field.description else None
    common: dict[str, Any] = {"help": help_text, "show_default": show_default}
    if kind.metavar is not None:
        common["metavar"] = kind.metavar
    if is_argument_field(field):
        info = typer.Argument(default, **common)
        label = f"argument {name}"
    else:
        decls = [f"--{dashed}/--no-{dashed}"] if kind.is_bool else [f"--{dashed}"]
        info = typer.Option(default, *decls, **common)
        label = f"--{dashed}"
    param = inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind.annotation
    )
    return param, _FieldSpec(name, kind, is_argument_field(field), label)


def _convert(spec: _FieldSpec, value: Any) -> Any:
    convert = spec.kind.convert
    if spec.kind.is_list:
        values = list(value or ())
        return [convert(v) for v in values] if convert else values
    return convert(value) if convert and value is not None else value


# --------------------------------------------------------------------------------------------
# Running a tool and showing what came back
# --------------------------------------------------------------------------------------------


class _ProgressDisplay:
    """``ToolContext.progress`` for the CLI: a rich progress bar on stderr when it is a terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None
        self._description = ""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __call__(
        self, done: float, total: float | None = None, message: str | None = None
    ) -> None:
        if not self.enabled:
            return
        try:
            if self._progress is None:
                from rich.progress import (
                    BarColumn,
                    Progress,
                    SpinnerColumn,
                    TaskProgressColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )

                self._progress = Progress(
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    BarColumn(),
                    TaskProgressColumn(),
                    TimeElapsedColumn(),
                    console=Console(stderr=True),
                    transient=True,
                )
                self._task = self._progress.add_task(
                    escape(message or ""), total=total, completed=done
                )
                self._progress.start()
            if message is not None:
                self._description = escape(message)
            self._progress.update(
                self._task, completed=done, total=total, description=self._description
            )
        except Exception:  # noqa: BLE001  (progress must never break a tool)
            self.enabled = False


def _fail(message: str, hint: str | None, kind: str, as_json: bool) -> NoReturn:
    if as_json:
        typer.echo(json.dumps({"error": message, "hint": hint, "type": kind}, indent=2))
    else:
        typer.echo(f"error: {message}", err=True)
        if hint:
            typer.echo(f"hint: {hint}", err=True)
    raise typer.Exit(EXIT_USER_ERROR)


def _describe_validation_error(
    exc: ValidationError, specs: dict[str, _FieldSpec]
) -> str:
    parts = []
    for err in exc.errors():
        loc = err.get("loc") or ()
        if loc:
            head = str(loc[0])
            where = specs[head].label if head in specs else head
            rest = ".".join(str(p) for p in loc[1:])
            parts.append(f"{where}{'.' + rest if rest else ''}: {err['msg']}")
        else:
            parts.append(str(err["msg"]))
    return "invalid " + "; ".join(parts)


def _compact(value: Any) -> Any:
    """A rich renderable for one (JSON-mode) value: scalars as text, lists of flat records as a
    nested table, anything else as compact JSON."""
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, (str, int, float, bool)):
        return Text(str(value))
    if isinstance(value, list):
        if not value:
            return Text("[]", style="dim")
        if all(isinstance(v, dict) for v in value):
            keys: list[str] = []
            for row in value:
                keys.extend(k for k in row if k not in keys)
            table = Table(
                show_edge=False, pad_edge=False, box=None, header_style="bold"
            )
            for key in keys:
                table.add_column(key, overflow="fold")
            for row in value:
                table.add_row(*(_compact_cell(row.get(k)) for k in keys))
            return table
        if all(isinstance(v, (str, int, float, bool)) or v is None for v in value):
            return Text(", ".join("-" if v is None else str(v) for v in value))
    return Text(json.dumps(value, separators=(",", ":"), default=str))


def _compact_cell(value: Any) -> Text:
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, (str, int, float, bool)):
        return Text(str(value))
    return Text(json.dumps(value, separators=(",", ":"), default=str))


def generic_render(result: BaseModel) -> Table:
    """The default human view of a result: one row per field."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    for name, value in result.model_dump(mode="json").items():
        table.add_row(name, _compact(value))
    return table


def _run_tool(
    tool: Tool,
    data: dict[str, Any],
    specs: dict[str, _FieldSpec],
    repo: Path | None,
    as_json: bool,
) -> None:
    try:
        request = tool.request.model_validate(data)
    except ValidationError as exc:
        _fail(
            _describe_validation_error(exc, specs),
            f"see `modulelens {tool.cli_name} --help`",
            "ValidationError",
            as_json,
        )
    error: ModuleLensError | None = None
    with _ProgressDisplay(enabled=_stderr_is_terminal()) as progress:
        ctx = ToolContext(
            repo_root=repo if repo is not None else default_repo_root(),
            progress=progress,
        )
        try:
            result = tool.fn(request, ctx)
        except ModuleLensError as exc:
            error = exc
    if error is not None:  # reported once the progress display is gone
        _fail(error.message, error.hint, type(error).__name__, as_json)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    renderable = (
        tool.render(result) if tool.render is not None else generic_render(result)
    )
    Console().print(renderable)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def _repo_option() -> Any:
    return typer.Option(
        None,
        "--repo",
        help="Repository directory.",
        show_default="$MODULELENS_HOME, else ./.modulelens",
        file_okay=False,
    )


def _make_command(tool: Tool) -> Callable[..., None]:
    params: list[inspect.Parameter] = []
    specs: dict[str, _FieldSpec] = {}
    for name, field in tool.request.model_fields.items():
        if name in _RESERVED_FIELDS:
            raise ValueError(
                f"tool {tool.name!r}: request field {name!r} clashes with a common CLI option"
            )
        param, spec = _field_parameter(name, field)
        params.append(param)
        specs[name] = spec
    params.append(
        inspect.Parameter(
            _REPO_PARAM,
            inspect.Parameter.KEYWORD_ONLY,
            default=_repo_option(),
            annotation=Path,
        )
    )
    params.append(
        inspect.Parameter(
            _JSON_PARAM,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(
                False,
                "--json",
                help="Print the result as JSON (and nothing else) on stdout.",
            ),
            annotation=bool,
        )
    )
    params.append(
        inspect.Parameter(
            _CTX_PARAM, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context
        )
    )

    def command(**kwargs: Any) -> None:
        repo = kwargs.pop(_REPO_PARAM, None)
        as_json = bool(kwargs.pop(_JSON_PARAM, False))
        cli_ctx = kwargs.pop(_CTX_PARAM)
        data: dict[str, Any] = {}
        for name, value in kwargs.items():
            # Only what the user gave: the request model's own defaults apply to the rest.
            source = cli_ctx.get_parameter_source(name)
            if source is None or source.name == "DEFAULT":
                continue
            data[name] = _convert(specs[name], value)
        _run_tool(tool, data, specs, repo, as_json)

    command.__name__ = tool.name
    command.__qualname__ = tool.name
    command.__doc__ = tool.summary
    command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return command


def build_app(tools: list[Tool]) -> typer.Typer:
    """A Typer application with one command per tool, plus ``mcp`` and ``version``."""
    app = typer.Typer(
        name="modulelens",
        help="Capture, store and replay the inputs and outputs of PyTorch modules.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
        rich_markup_mode="rich",
    )

    @app.callback()
    def _root() -> None:
        """Capture, store and replay the inputs and outputs of PyTorch modules."""

    seen: set[str] = set(_EXTRA_COMMANDS)
    for tool in tools:
        if tool.cli_name in seen:
            raise ValueError(f"two commands named {tool.cli_name!r}")
        seen.add(tool.cli_name)
        summary = escape(tool.summary)
        app.command(
            name=tool.cli_name,
            help=summary,
            short_help=summary.strip().splitlines()[0] if summary else None,
        )(_make_command(tool))

    @app.command("mcp")
    def mcp_command(repo: Path | None = _repo_option()) -> None:  # noqa: B008
        """Serve every tool over MCP on stdio (stdout is the protocol; logs go to stderr)."""
        from modulelens.mcp_server.server import run_stdio

        run_stdio(repo)

    @app.command("version")
    def version_command() -> None:
        """Print the modulelens version."""
        typer.echo(package_version())

    return app


_APP: typer.Typer | None = None


def get_app() -> typer.Typer:
    """The application for every registered tool (built on first use)."""
    global _APP
    if _APP is None:
        _APP = build_app(all_tools())
    return _APP


def __getattr__(name: str) -> Any:
    # ``from modulelens.cli.app import app``: built lazily, so importing this module (e.g. for
    # build_app in tests) does not import every tool.
    if name == "app":
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point (``modulelens = "modulelens.cli.app:main"``)."""
    get_app()(prog_name="modulelens")
