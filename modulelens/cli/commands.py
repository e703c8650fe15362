"""Click parameters and commands built from request models, and their help.

Each field of a request model becomes one click parameter, constructed directly (no function
signature is generated for a framework to read back): ``max_tensor_bytes`` is the option
``--max-tensor-bytes``; a field marked ``json_schema_extra={"cli": "argument"}`` is a positional
argument (variadic for a list: everything after ``--`` lands in it); a ``bool`` is a
``--name/--no-name`` flag; a ``Literal`` or an ``Enum`` is a choice; a list is an option given once
per value; anything else (nested models, dicts) is JSON text. Defaults are shown in ``--help`` only:
the command passes the request model only what was given on the command line.

Help is plain text (click's layout, with an ``Arguments`` section) or, on a terminal, drawn with
rich: the same sections as panels. Either way it ends with the tool's example.
"""

from __future__ import annotations

import collections.abc
import enum
import io
import json
import os
import shutil
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from modulelens.kinds import singular_aliases

__all__ = ["CliType", "CommandGroup", "FieldSpec", "HelpArgument", "ToolCommand", "cli_type", "convert",
           "field_parameter", "is_argument_field"]


def is_argument_field(field: FieldInfo) -> bool:
    """True when the field is marked ``json_schema_extra={"cli": "argument"}`` (positional)."""
    extra = field.json_schema_extra
    return isinstance(extra, dict) and extra.get("cli") == "argument"


@dataclass(frozen=True)
class CliType:
    """How one field is parsed on the command line."""

    click_type: click.ParamType
    metavar: str
    convert: Callable[[Any], Any] | None = None  # applied to each parsed value
    is_list: bool = False
    is_bool: bool = False


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


_SCALARS: dict[Any, tuple[click.ParamType, str]] = {str: (click.STRING, "<str>"), int: (click.INT, "<int>"),
                                                    float: (click.FLOAT, "<float>")}


class _KindChoice(click.Choice):
    """A choice that also takes the singular of a kind name among its choices (``show capture``
    as ``show captures``, see :mod:`modulelens.kinds`); the help lists only the choices."""

    def __init__(self, choices: list[str]) -> None:
        super().__init__(choices)
        self.aliases = singular_aliases(choices)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(self.aliases.get(value, value), param, ctx)


def _scalar(tp: Any) -> CliType | None:
    tp = _strip_optional(tp)
    if tp is bool:
        return CliType(click.BOOL, "<bool>", is_bool=True)
    if tp in _SCALARS:
        return CliType(*_SCALARS[tp])
    if isinstance(tp, type) and issubclass(tp, PurePath):
        return CliType(click.Path(path_type=Path), "<path>")
    if get_origin(tp) is Literal:
        choices = [str(v) for v in get_args(tp)]
        return CliType(_KindChoice(choices), f"<{'|'.join(choices)}>")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        choices = [str(m.value) for m in tp]
        return CliType(click.Choice(choices), f"<{'|'.join(choices)}>")
    return None


def cli_type(annotation: Any) -> CliType:
    """How a field of type ``annotation`` is given: a scalar, a choice, a list of them, or JSON."""
    tp = _strip_optional(annotation)
    origin = get_origin(tp)
    if origin in (list, set, frozenset, tuple, collections.abc.Sequence, collections.abc.Set):
        args = get_args(tp)
        fixed_tuple = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
        inner = None if fixed_tuple else (_scalar(args[0]) if args else CliType(click.STRING, "<str>"))
        if inner is not None and not inner.is_bool:
            return CliType(inner.click_type, inner.metavar, inner.convert, is_list=True)
    scalar = _scalar(tp)
    if scalar is not None:
        return scalar
    return CliType(click.STRING, "JSON", convert=_json_or_text)  # nested models, dicts, fixed tuples


def convert(kind: CliType, value: Any) -> Any:
    """A parsed value as the request model takes it (lists as lists, JSON text parsed)."""
    if kind.is_list:
        values = list(value or ())
        return [kind.convert(v) for v in values] if kind.convert else values
    return kind.convert(value) if kind.convert and value is not None else value


def _is_simple(value: Any) -> bool:
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_is_simple(v) and not isinstance(v, (list, tuple, set, frozenset)) for v in value)
    return value is None or isinstance(value, (str, int, float, bool, enum.Enum, PurePath))


def _shown_default(field: FieldInfo, kind: CliType) -> tuple[Any, bool | str]:
    """(default, show_default) for ``--help``. Only for display: a value not given on the command
    line is left out of the request, so the model's own default applies."""
    try:
        value = field.get_default(call_default_factory=True, validated_data={})
    except Exception:  # noqa: BLE001  (a factory that needs other fields: nothing to show)
        return None, False
    if isinstance(value, (set, frozenset, tuple)):
        value = list(value)
    if isinstance(value, enum.Enum):
        value = value.value
    if value == {}:
        return None, False
    if _is_simple(value) and kind.metavar != "JSON" and kind.is_list == isinstance(value, list):
        return value, value is not None and value != []
    if isinstance(value, BaseModel):
        return None, value.model_dump_json()
    try:
        return None, json.dumps(value, default=str)
    except (TypeError, ValueError):
        return None, False


@dataclass(frozen=True)
class FieldSpec:
    """A request field as the command line has it."""

    name: str
    kind: CliType
    is_argument: bool
    label: str  # how errors name it: "--max-tensor-bytes" or "argument script"


class HelpArgument(click.Argument):
    """A positional argument with a help text (shown in the ``Arguments`` section)."""

    def __init__(self, decls: Sequence[str], *, help_text: str | None = None, show_default: bool | str = False,
                 metavar: str | None = None, **attrs: Any):
        name = str(list(decls)[0]).upper() + ("..." if attrs.get("nargs") == -1 else "")
        usage = name if attrs.get("required") else f"[{name}]"  # KIND [OF] [SCRIPT_ARGS...]
        super().__init__(list(decls), metavar=usage, **attrs)
        self.help_text = help_text
        self.shown_default = show_default
        self.shown_metavar = metavar

    def help_record(self) -> tuple[str, str]:
        """(name and metavar, help with its default or ``[required]``), as for an option."""
        extra = "[required]" if self.required else ""
        if self.shown_default is not False and self.default not in (None, (), []):
            extra = f"[default: {self.shown_default if isinstance(self.shown_default, str) else self.default}]"
        return f"{self.name} {self.shown_metavar or ''}".strip(), " ".join(x for x in (self.help_text, extra) if x)


def field_parameter(name: str, field: FieldInfo, help_text: str | None) -> tuple[click.Parameter, FieldSpec]:
    """The click parameter of request field ``name`` (see the module docstring) and its spec."""
    kind = cli_type(field.annotation)
    dashed = name.replace("_", "-")
    required = field.is_required()
    default, show_default = (None, False) if required else _shown_default(field, kind)
    if is_argument_field(field):
        param: click.Parameter = HelpArgument(
            [name], help_text=help_text, show_default=show_default, metavar=kind.metavar, type=kind.click_type,
            required=required, nargs=-1 if kind.is_list else 1, default=None if kind.is_list else default)
        return param, FieldSpec(name, kind, True, f"argument {name}")
    if kind.is_bool:
        param = click.Option([name, f"--{dashed}/--no-{dashed}"], default=bool(default), show_default=show_default,
                             help=help_text)
    else:
        param = click.Option([name, f"--{dashed}"], type=kind.click_type, metavar=kind.metavar, required=required,
                             multiple=kind.is_list, default=default if default is not None else None,
                             show_default=show_default, help=help_text)
    return param, FieldSpec(name, kind, False, f"--{dashed}")


# --------------------------------------------------------------------------------------------
# Help, plain or rich
# --------------------------------------------------------------------------------------------


def _width() -> int:
    try:
        return max(60, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return max(60, shutil.get_terminal_size().columns)


def _draw(lines: list[Any]) -> str:
    """Rich renderables as terminal text (colours and boxes)."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=_width(), highlight=False, soft_wrap=False)
    for line in lines:
        console.print(line)
    return out.getvalue()


def _panel(title: str, rows: list[tuple[str, str]]) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold cyan", no_wrap=True)
    grid.add_column()
    for left, right in rows:
        grid.add_row(Text(left), Text(right))
    return Panel(grid, title=title, title_align="left", border_style="dim")


def _usage(command: click.Command, ctx: click.Context) -> str:
    return f"{ctx.command_path} {' '.join(command.collect_usage_pieces(ctx))}".strip()


class ToolCommand(click.Command):
    """A command whose help lists its positional arguments too, drawn with rich when
    ``rich_help`` (panels), else as plain text; the epilog (its example) is kept as written."""

    def __init__(self, *args: Any, rich_help: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rich_help = rich_help

    def _arguments(self) -> list[tuple[str, str]]:
        return [p.help_record() for p in self.params if isinstance(p, HelpArgument)]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self._arguments():
            with formatter.section("Arguments"):
                formatter.write_dl(self._arguments())
        super().format_options(ctx, formatter)

    def get_help(self, ctx: click.Context) -> str:
        if not self.rich_help:
            return super().get_help(ctx)
        options = [r for p in self.get_params(ctx) if not isinstance(p, HelpArgument)
                   and (r := p.get_help_record(ctx)) is not None]
        parts: list[Any] = [Text(f"Usage: {_usage(self, ctx)}", style="bold"), ""]
        if self.help:
            parts += [Text(self.help), ""]
        if self._arguments():
            parts.append(_panel("Arguments", self._arguments()))
        parts.append(_panel("Options", options))
        if self.epilog:
            parts += ["", Text(self.epilog.replace("\b\n", ""))]
        return _draw(parts).rstrip("\n")


class CommandGroup(click.Group):
    """The ``modulelens`` group: commands listed in the order they were added (the registry's),
    help drawn with rich when ``rich_help``."""

    def __init__(self, *args: Any, rich_help: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rich_help = rich_help

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def get_help(self, ctx: click.Context) -> str:
        if not self.rich_help:
            return super().get_help(ctx)
        rows = [(name, cmd.get_short_help_str(limit=90)) for name, cmd in self.commands.items() if not cmd.hidden]
        options = [r for p in self.get_params(ctx) if (r := p.get_help_record(ctx)) is not None]
        parts: list[Any] = [Text(f"Usage: {_usage(self, ctx)}", style="bold"), ""]
        if self.help:
            parts += [Text(self.help), ""]
        parts += [_panel("Options", options), _panel("Commands", rows)]
        return _draw(parts).rstrip("\n")
