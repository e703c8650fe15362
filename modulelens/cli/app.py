"""The ``modulelens`` command line, generated from a list of tools.

Each :class:`~modulelens.registry.Tool` becomes one command named ``tool.cli_name``. Its options
come from the request model's fields: ``max_tensor_bytes`` becomes ``--max-tensor-bytes`` (the
same names the MCP server uses, with dashes). A field whose ``json_schema_extra`` holds
``{"cli": "argument"}`` is a positional argument instead; a ``list[str]`` argument is variadic,
and everything after ``--`` lands in it::

    modulelens capture-module train.py --module blocks.1 -- --steps 3

Every command also takes ``--repo DIR``, ``--json`` (the result as JSON, nothing else),
``--quiet`` (no progress) and ``--wide`` (every table column in full), and its ``--help`` ends
with an example (:mod:`modulelens.cli.examples`). Only values given on the command line are
passed to the request model, so the model's own defaults (and default factories) always apply.
The front end holds no logic of its own: it builds the request, calls ``tool.fn`` with a progress
display (:mod:`modulelens.cli.progress`) and shows the result (the view of its model in
:mod:`modulelens.cli.views`, else ``tool.render``, else one row per field), or the error with its
hint (exit code 2). Colours and boxes only on a terminal; ``NO_COLOR`` is honoured (rich).
"""

from __future__ import annotations

import collections.abc
import enum
import inspect
import json
import shlex
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, NoReturn, Union, get_args, get_origin

import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.text import Text

from modulelens.arguments import argument_errors
from modulelens.cli.examples import example_line
from modulelens.cli.formats import printable, printable_value
from modulelens.cli.progress import ProgressReporter, progress_mode
from modulelens.cli.views import generic_view, left_out_notes, view_for
from modulelens.errors import ModuleLensError, render
from modulelens.registry import Tool, ToolContext, ToolRegistry
from modulelens.replies import NextCall, rendered_reply
from modulelens.repo import default_repo_root
from modulelens.tools import all_tools
from modulelens.version import package_version

__all__ = ["build_app", "get_app", "is_argument_field", "main"]

EXIT_USER_ERROR = 2

# Python names of the options every command has; not valid field names (see _RESERVED_FIELDS).
_REPO_PARAM = "ml_repo_"
_JSON_PARAM = "ml_json_"
_QUIET_PARAM = "ml_quiet_"
_WIDE_PARAM = "ml_wide_"
_CTX_PARAM = "ml_ctx_"
_RESERVED_FIELDS = {"repo", "json", "quiet", "wide", "help", _REPO_PARAM, _JSON_PARAM, _QUIET_PARAM, _WIDE_PARAM,
                    _CTX_PARAM}
_EXTRA_COMMANDS = {"mcp", "ui", "version"}


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
    name: str, field: FieldInfo, rich_help: bool
) -> tuple[inspect.Parameter, _FieldSpec]:
    kind = _cli_type(field.annotation)
    dashed = name.replace("_", "-")
    default, show_default = _cli_default(field, kind)
    help_text = _help_text(render(field.description, "cli"), rich_help) if field.description else None
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


def _fail(message: str, hint: str | None, kind: str, as_json: bool) -> NoReturn:
    """Report an error (argument markers written as flags, see :mod:`modulelens.errors`) and exit 2."""
    message = render(message, "cli")
    hint = None if hint is None else render(hint, "cli")
    if as_json:
        typer.echo(json.dumps({"error": message, "hint": hint, "type": kind}, indent=2))
    else:
        typer.echo(f"error: {printable(message)}", err=True)
        if hint:
            typer.echo(f"hint: {printable(hint)}", err=True)
    raise typer.Exit(EXIT_USER_ERROR)


def _describe_validation_error(
    exc: ValidationError, specs: dict[str, _FieldSpec]
) -> str:
    """One line per invalid option or argument, named as on the command line (``invalid --top:
    got 0, expected ...``); a check across options is its own line."""
    labels = tuple(spec.label for spec in specs.values())
    lines = [f"invalid {line}" if line.startswith(labels) else line
             for line in argument_errors(exc, label=lambda name: specs[name].label if name in specs else name,
                                         front="cli")]
    return lines[0] if len(lines) == 1 else "\n".join(lines)


@dataclass(frozen=True)
class _CommonOptions:
    """The options every tool command has besides its request's fields."""

    repo: Path | None
    as_json: bool
    quiet: bool
    wide: bool


def _run_tool(tool: Tool, data: dict[str, Any], specs: dict[str, _FieldSpec], common: _CommonOptions,
              tools: ToolRegistry) -> None:
    try:
        request = tool.request.model_validate(data)
    except ValidationError as exc:
        _fail(
            _describe_validation_error(exc, specs),
            f"see `modulelens {tool.cli_name} --help`",
            "ValidationError",
            common.as_json,
        )
    mode = progress_mode(quiet=common.quiet, as_json=common.as_json)
    try:
        with ProgressReporter(tool.cli_name, mode) as progress:  # gone before anything else is printed
            ctx = ToolContext(repo_root=common.repo if common.repo is not None else default_repo_root(),
                              progress=progress)
            result = tool.fn(request, ctx)
    except ModuleLensError as exc:
        _fail(exc.message, exc.hint, type(exc).__name__, common.as_json)
    if common.as_json:
        typer.echo(json.dumps(rendered_reply(result, "cli"), indent=2))
        return
    _show(tool, result, common.wide, tools)


def cli_command(suggested: NextCall, tools: ToolRegistry) -> str:
    """A suggested call as a command line: ``modulelens replay-module blk:v1 --strategy export``
    (positional arguments in order, then options); a tool the CLI does not have (the MCP job
    tools) as its name and arguments."""
    if suggested.tool not in tools:
        return f"{suggested.tool} {json.dumps(suggested.arguments)}"
    target = tools.get(suggested.tool)
    words, options = ["modulelens", target.cli_name], []
    for name, field in target.request.model_fields.items():
        if name not in suggested.arguments:
            continue
        value = suggested.arguments[name]
        values = value if isinstance(value, list) else [value]
        flag = "--" + name.replace("_", "-")
        if is_argument_field(field):
            words += [str(v) for v in values]
        elif isinstance(value, bool):
            options.append(flag if value else f"--no-{flag[2:]}")
        else:
            for v in values:
                options += [flag, v if isinstance(v, str) else json.dumps(v)]
    return shlex.join(words + options)


def advice_lines(result: BaseModel, tools: ToolRegistry) -> list[RenderableType]:
    """The result's warnings (argument markers as flags) and its next calls as command lines."""
    lines: list[RenderableType] = [Text(f"warning: {render(w, 'cli')}", style="yellow")
                                   for w in getattr(result, "warnings", None) or []]
    lines += [Text(f"next: {cli_command(c, tools)}", style="cyan") for c in getattr(result, "next", None) or []]
    return lines


def _show(tool: Tool, result: BaseModel, wide: bool, tools: ToolRegistry) -> None:
    """Print the result for a person: the CLI's view of its model, else the tool's own renderer,
    else one row per field. ``crop=False``: a table whose ids do not fit is wider than the terminal,
    never cut (see :mod:`modulelens.cli.tables`). Lists the result cut short get one line each
    under it. Control characters in any text of the result are shown as escapes, never sent to
    the terminal."""
    result = printable_value(result)
    view = view_for(type(result))
    if view is not None:
        renderable = view(result, wide)
    elif tool.render is not None:
        renderable = tool.render(result)
    else:
        renderable = generic_view(result, wide)
    Console().print(Group(renderable, *left_out_notes(result, tool.request), *advice_lines(result, tools)),
                    crop=False)


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


def _common_parameters() -> list[inspect.Parameter]:
    """``--repo``, ``--json``, ``--quiet``, ``--wide`` and the click context, for one command."""
    options: list[tuple[str, Any, Any]] = [
        (_REPO_PARAM, Path, _repo_option()),
        (_JSON_PARAM, bool, typer.Option(False, "--json", help="Print the result as JSON (and nothing else) on "
                                         "stdout; no progress display.")),
        (_QUIET_PARAM, bool, typer.Option(False, "--quiet", "-q", help="No progress display while the tool works.")),
        (_WIDE_PARAM, bool, typer.Option(False, "--wide", help="Show every table column in full, even wider than "
                                         "the terminal.")),
    ]
    params = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
              for name, annotation, default in options]
    params.append(inspect.Parameter(_CTX_PARAM, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
    return params


def _make_command(tool: Tool, rich_help: bool, tools: ToolRegistry) -> Callable[..., None]:
    params: list[inspect.Parameter] = []
    specs: dict[str, _FieldSpec] = {}
    for name, field in tool.request.model_fields.items():
        if name in _RESERVED_FIELDS:
            raise ValueError(
                f"tool {tool.name!r}: request field {name!r} clashes with a common CLI option"
            )
        param, spec = _field_parameter(name, field, rich_help)
        params.append(param)
        specs[name] = spec
    params += _common_parameters()

    def command(**kwargs: Any) -> None:
        common = _CommonOptions(
            repo=kwargs.pop(_REPO_PARAM, None),
            as_json=bool(kwargs.pop(_JSON_PARAM, False)),
            quiet=bool(kwargs.pop(_QUIET_PARAM, False)),
            wide=bool(kwargs.pop(_WIDE_PARAM, False)),
        )
        cli_ctx = kwargs.pop(_CTX_PARAM)
        data: dict[str, Any] = {}
        for name, value in kwargs.items():
            # Only what the user gave: the request model's own defaults apply to the rest.
            source = cli_ctx.get_parameter_source(name)
            if source is None or source.name == "DEFAULT":
                continue
            data[name] = _convert(specs[name], value)
        _run_tool(tool, data, specs, common, tools)

    command.__name__ = tool.name
    command.__qualname__ = tool.name
    command.__doc__ = tool.summary
    command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return command


def _stdout_is_terminal() -> bool:
    return Console().is_terminal


def _help_text(text: str, rich_help: bool) -> str:
    """Help text as typer shows it: rich markup is escaped when help is drawn with rich."""
    return escape(text) if rich_help else text


def _epilog(tool: Tool, rich_help: bool) -> str | None:
    """The example at the end of ``--help`` (click rewraps plain epilogs unless told not to: ``\\b``)."""
    line = example_line(tool.name, tool.cli_name)
    if line is None:
        return None
    return f"Example:\n\n  {escape(line)}" if rich_help else f"\b\nExample:\n  {line}"


def build_app(tools: Iterable[Tool], rich_help: bool | None = None) -> typer.Typer:
    """A Typer application with one command per tool, plus ``mcp``, ``ui`` and ``version``.

    ``rich_help``: draw ``--help`` and usage errors with rich (colours, panels); by default only
    when stdout is a terminal, so piped help is plain text without boxes.
    """
    if rich_help is None:
        rich_help = _stdout_is_terminal()
    app = typer.Typer(
        name="modulelens",
        help="Capture, store and replay the inputs and outputs of PyTorch modules.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
        rich_markup_mode="rich" if rich_help else None,
    )

    @app.callback()
    def _root() -> None:
        """Capture, store and replay the inputs and outputs of PyTorch modules."""

    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
    seen: set[str] = set(_EXTRA_COMMANDS)
    for tool in registry:
        if tool.cli_name in seen:
            raise ValueError(f"two commands named {tool.cli_name!r}")
        seen.add(tool.cli_name)
        summary = _help_text(render(tool.summary, "cli"), rich_help)
        app.command(
            name=tool.cli_name,
            help=summary,
            short_help=summary.strip().splitlines()[0] if summary else None,
            epilog=_epilog(tool, rich_help),
        )(_make_command(tool, rich_help, registry))

    @app.command("mcp")
    def mcp_command(repo: Path | None = _repo_option()) -> None:  # noqa: B008
        """Serve every tool over MCP on stdio (stdout is the protocol; logs go to stderr)."""
        from modulelens.mcp_server.server import run_stdio

        run_stdio(repo)

    # A server that runs until interrupted is no tool: through MCP it would never answer.
    @app.command("ui")
    def ui_command(
        repo: Path | None = _repo_option(),
        port: int | None = typer.Option(None, "--port", help="Port to listen on (0 picks a free one).",
                                        show_default="8765"),
        host: str | None = typer.Option(None, "--host", help="Address to bind; any but loopback needs --allow-remote.",
                                        show_default="127.0.0.1"),
        allow_remote: bool = typer.Option(False, "--allow-remote", help="Allow a non-loopback --host; every request "
                                          "then needs the token printed at start."),
        token: str | None = typer.Option(None, "--token", envvar="MODULELENS_UI_TOKEN",
                                         help="The token to require (default: a fresh one on a non-loopback host)."),
    ) -> None:
        """Serve the local web UI (captures, operator cards, candidates, statistics, jobs) until interrupted."""
        from modulelens.ui.server import serve

        try:
            serve(repo if repo is not None else default_repo_root(), host, port, allow_remote, token)
        except ModuleLensError as exc:
            _fail(exc.message, exc.hint, type(exc).__name__, False)

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
