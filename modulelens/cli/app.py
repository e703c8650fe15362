"""The ``modulelens`` command line, generated from a tool registry.

Each :class:`~modulelens.registry.Tool` becomes one click command named ``tool.cli_name``, built
directly from its request model (:mod:`modulelens.cli.commands`; no function signature is
generated): ``max_tensor_bytes`` becomes ``--max-tensor-bytes`` (the same names the MCP server
uses, with dashes). A field whose ``json_schema_extra`` holds ``{"cli": "argument"}`` is a
positional argument instead; a ``list[str]`` argument is variadic, and everything after ``--``
lands in it::

    modulelens capture-module train.py --module blocks.1 -- --steps 3

Every command also takes ``--repo DIR``, ``--json`` (the result as JSON, nothing else),
``--quiet`` (no progress) and ``--wide`` (every table column in full), and its ``--help`` ends
with an example (:mod:`modulelens.cli.examples`). Only values given on the command line are
passed to the request model, so the model's own defaults (and default factories) always apply.
Relative paths in a request are taken from the shell's working directory (``ToolContext.workdir``).
The front end holds no logic of its own: it builds the request, calls ``tool.fn`` with a progress
display (:mod:`modulelens.cli.progress`) and shows the result (the view of its model in
:mod:`modulelens.cli.views`, else ``tool.render``, else one row per field), or the error with its
hint (exit code 2). Markers in messages and warnings read as flags, suggested calls as command
lines (:func:`cli_text`). Colours and boxes only on a terminal; ``NO_COLOR`` is honoured (rich).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click
from click.core import ParameterSource
from pydantic import BaseModel, ValidationError
from rich.console import Console, Group, RenderableType
from rich.text import Text

from modulelens.arguments import argument_errors
from modulelens.cli.commands import CommandGroup, FieldSpec, ToolCommand, convert, field_parameter, is_argument_field
from modulelens.cli.examples import example_line
from modulelens.cli.formats import printable, printable_value
from modulelens.cli.progress import ProgressReporter, progress_mode
from modulelens.cli.views import generic_view, left_out_notes, view_for
from modulelens.errors import CallWriter, ModuleLensError, render
from modulelens.jobs.process import run_as_job
from modulelens.paths import outside_output_warnings
from modulelens.registry import Tool, ToolContext, ToolRegistry
from modulelens.replies import NextCall, rendered_reply
from modulelens.repo import default_repo_root
from modulelens.tools import all_tools
from modulelens.version import package_version

__all__ = ["build_app", "cli_command", "cli_text", "get_app", "is_argument_field", "main"]

EXIT_USER_ERROR = 2

# Python names of the options every command has; not valid field names (see _RESERVED_FIELDS).
_REPO_PARAM = "ml_repo_"
_JSON_PARAM = "ml_json_"
_QUIET_PARAM = "ml_quiet_"
_WIDE_PARAM = "ml_wide_"
_RESERVED_FIELDS = {"repo", "json", "quiet", "wide", "help", _REPO_PARAM, _JSON_PARAM, _QUIET_PARAM, _WIDE_PARAM}
_EXTRA_COMMANDS = {"mcp", "ui", "version"}
_REPO_DEFAULT_TEXT = "$MODULELENS_HOME, else ./.modulelens"


# --------------------------------------------------------------------------------------------
# Running a tool and showing what came back
# --------------------------------------------------------------------------------------------


def _fail(message: str, hint: str | None, kind: str, as_json: bool, tools: ToolRegistry) -> NoReturn:
    """Report an error (markers written for the CLI, see :func:`cli_text`) and exit 2."""
    message = cli_text(message, tools)
    hint = None if hint is None else cli_text(hint, tools)
    if as_json:
        click.echo(json.dumps({"error": message, "hint": hint, "type": kind}, indent=2))
    else:
        click.echo(f"error: {printable(message)}", err=True)
        if hint:
            click.echo(f"hint: {printable(hint)}", err=True)
    raise click.exceptions.Exit(EXIT_USER_ERROR)


def _describe_validation_error(exc: ValidationError, specs: dict[str, FieldSpec]) -> str:
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


def _run_tool(tool: Tool, data: dict[str, Any], specs: dict[str, FieldSpec], common: _CommonOptions,
              tools: ToolRegistry) -> None:
    try:
        request = tool.request.model_validate(data)
    except ValidationError as exc:
        _fail(_describe_validation_error(exc, specs), f"see `modulelens {tool.cli_name} --help`", "ValidationError",
              common.as_json, tools)
    mode = progress_mode(quiet=common.quiet, as_json=common.as_json)
    try:
        with ProgressReporter(tool.cli_name, mode) as progress:  # gone before anything else is printed
            ctx = ToolContext(repo_root=common.repo if common.repo is not None else default_repo_root(),
                              progress=progress, workdir=Path.cwd())
            result = run_as_job(tool, request, ctx)  # a long call is listed as a job meanwhile (the UI shows it)
    except ModuleLensError as exc:
        _fail(exc.message, exc.hint, type(exc).__name__, common.as_json, tools)
    outside = outside_output_warnings(request.model_dump(), ctx.project, ctx.repo_root)  # a person's path: said, not refused
    if outside and isinstance(getattr(result, "warnings", None), list):
        result = result.model_copy(update={"warnings": [*outside, *result.warnings]})
    if common.as_json:
        click.echo(json.dumps(rendered_reply(result, "cli", _call_writer(tools)), indent=2))
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


def _call_writer(tools: ToolRegistry) -> CallWriter:
    return lambda tool, arguments: cli_command(NextCall(tool=tool, arguments=arguments), tools)


def cli_text(text: str, tools: ToolRegistry) -> str:
    """``text`` as the CLI shows it: argument markers as flags, suggested calls as command lines."""
    return render(text, "cli", _call_writer(tools))


def advice_lines(result: BaseModel, tools: ToolRegistry) -> list[RenderableType]:
    """The result's warnings (argument markers as flags) and its next calls as command lines."""
    lines: list[RenderableType] = [Text(f"warning: {cli_text(w, tools)}", style="yellow")
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


def _repo_option() -> click.Option:
    return click.Option([_REPO_PARAM, "--repo"], type=click.Path(file_okay=False, path_type=Path), metavar="<dir>",
                        help="Repository directory.", show_default=_REPO_DEFAULT_TEXT)


def _common_parameters() -> list[click.Parameter]:
    """``--repo``, ``--json``, ``--quiet`` and ``--wide``, for one command."""
    return [
        _repo_option(),
        click.Option([_JSON_PARAM, "--json"], is_flag=True, help="Print the result as JSON (and nothing else) on "
                     "stdout; no progress display."),
        click.Option([_QUIET_PARAM, "--quiet", "-q"], is_flag=True, help="No progress display while the tool works."),
        click.Option([_WIDE_PARAM, "--wide"], is_flag=True, help="Show every table column in full, even wider than "
                     "the terminal."),
    ]


def _epilog(tool: Tool) -> str | None:
    """The example at the end of ``--help`` (click rewraps plain epilogs unless told not to: ``\\b``)."""
    line = example_line(tool.name, tool.cli_name)
    return None if line is None else f"\b\nExample:\n  {line}"


def _tool_command(tool: Tool, rich_help: bool, tools: ToolRegistry) -> ToolCommand:
    """The command of ``tool``: one parameter per request field, then the common options."""
    params: list[click.Parameter] = []
    specs: dict[str, FieldSpec] = {}
    for name, field in tool.request.model_fields.items():
        if name in _RESERVED_FIELDS:
            raise ValueError(f"tool {tool.name!r}: request field {name!r} clashes with a common CLI option")
        help_text = cli_text(field.description, tools) if field.description else None
        param, specs[name] = field_parameter(name, field, help_text)
        params.append(param)

    def run(**values: Any) -> None:
        common = _CommonOptions(repo=values.pop(_REPO_PARAM, None), as_json=bool(values.pop(_JSON_PARAM, False)),
                                quiet=bool(values.pop(_QUIET_PARAM, False)), wide=bool(values.pop(_WIDE_PARAM, False)))
        ctx = click.get_current_context()
        # Only what the user gave: the request model's own defaults apply to the rest.
        data = {name: convert(specs[name].kind, value) for name, value in values.items()
                if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)}
        _run_tool(tool, data, specs, common, tools)

    summary = cli_text(tool.summary, tools)
    return ToolCommand(tool.cli_name, callback=run, params=params + _common_parameters(), help=summary,
                       short_help=summary.strip().splitlines()[0] if summary else None, epilog=_epilog(tool),
                       rich_help=rich_help)


def _stdout_is_terminal() -> bool:
    return Console().is_terminal


def _mcp_command() -> click.Command:
    def run(**values: Any) -> None:
        from modulelens.mcp_server.server import run_stdio

        run_stdio(values[_REPO_PARAM])

    return click.Command("mcp", callback=run, params=[_repo_option()],
                         help="Serve every tool over MCP on stdio (stdout is the protocol; logs go to stderr).")


def _ui_command(tools: ToolRegistry) -> click.Command:
    # A server that runs until interrupted is no tool: through MCP it would never answer.
    def run(**values: Any) -> None:
        from modulelens.ui.server import serve

        repo = values[_REPO_PARAM]
        try:
            serve(repo if repo is not None else default_repo_root(), values["host"], values["port"],
                  values["allow_remote"], values["token"])
        except ModuleLensError as exc:
            _fail(exc.message, exc.hint, type(exc).__name__, False, tools)

    return click.Command("ui", callback=run, help="Serve the local web UI (captures, operator cards, candidates, "
                         "searches, statistics, jobs) until interrupted.", params=[
        _repo_option(),
        click.Option(["port", "--port"], type=int, metavar="<int>", show_default="8765",
                     help="Port to listen on (0 picks a free one)."),
        click.Option(["host", "--host"], metavar="<str>", show_default="127.0.0.1",
                     help="Address to bind; any but loopback needs --allow-remote."),
        click.Option(["allow_remote", "--allow-remote"], is_flag=True, help="Allow a non-loopback --host; every "
                     "browser then needs the token printed at start (exchanged for a cookie on the first visit)."),
        click.Option(["token", "--token"], metavar="<str>", envvar="MODULELENS_UI_TOKEN",
                     help="The token to require (default: a fresh one on a non-loopback host)."),
    ])


def _version_command() -> click.Command:
    return click.Command("version", callback=lambda: click.echo(package_version()),
                         help="Print the modulelens version.")


def build_app(tools: Iterable[Tool], rich_help: bool | None = None) -> click.Group:
    """The ``modulelens`` click group: one command per tool, plus ``mcp``, ``ui`` and ``version``.

    ``rich_help``: draw ``--help`` with rich (colours, panels); by default only when stdout is a
    terminal, so piped help is plain text without boxes.
    """
    if rich_help is None:
        rich_help = _stdout_is_terminal()
    registry = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
    app = CommandGroup("modulelens", help="Capture, store and replay the inputs and outputs of PyTorch modules.",
                       no_args_is_help=True, rich_help=rich_help)
    for tool in registry:
        if tool.cli_name in _EXTRA_COMMANDS or tool.cli_name in app.commands:
            raise ValueError(f"two commands named {tool.cli_name!r}")
        app.add_command(_tool_command(tool, rich_help, registry))
    for command in (_mcp_command(), _ui_command(registry), _version_command()):
        app.add_command(command)
    return app


_APP: click.Group | None = None


def get_app() -> click.Group:
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
    get_app().main(prog_name="modulelens")
