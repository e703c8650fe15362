"""Errors that reach users: each says what is wrong and how to fix it.

Messages and hints name tool arguments with a marker that each front end renders its own way:
``[--target CARD]`` is ``--target CARD`` in the CLI and ``target`` over MCP and in Python;
``[--strategy export]`` is ``--strategy export`` / ``strategy=export``; ``[--no-eager]`` is
``--no-eager`` / ``eager=false``; ``[--trust-pickle]`` is ``--trust-pickle`` / ``trust_pickle``.
A value written in capitals (``CARD``, ``FILE``, ``N``) is a placeholder, shown only in the CLI.
Write markers with :func:`arg` or by hand; :func:`render` turns them into one front end's text.

A suggested call of a tool is a marker too, written with :func:`tool_call`
(``[[validate_kernel {"candidate":"blk.card6:v1"}]]``): over MCP (and in Python) it reads
``validate_kernel {"candidate": "blk.card6:v1"}``, in the CLI ``modulelens validate-kernel
blk.card6:v1``. Writing a command line needs the registry (which arguments are positional), so the
CLI hands :func:`render` its own writer; without one a call reads as over MCP.

The raw text (``ModuleLensError.message`` and ``.hint``) keeps the markers, so an error can cross
a process boundary and still be rendered by whichever front end shows it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal

Front = Literal["cli", "args"]
"""How argument markers read: ``cli`` as command-line flags, ``args`` as argument names (MCP, Python)."""

_MARKER = re.compile(r"\[--(?P<no>no-)?(?P<name>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?: (?P<value>[^\[\]]+))?\]"
                     r"|\[\[(?P<tool>[a-z][a-z0-9_]*)(?: (?P<arguments>\{.*?\}))?\]\]")

CallWriter = Callable[[str, dict[str, Any]], str]
"""(tool name, arguments) -> how a front end writes that call."""
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(?:\.\.\.)?")


def arg(name: str, value: object = None) -> str:
    """The marker for argument ``name`` (a request field name), with ``value`` when given: a
    placeholder in capitals (``"CARD"``), a value, or a bool (False reads ``--no-NAME``)."""
    flag = name.replace("_", "-")
    if value is False:
        return f"[--no-{flag}]"
    if value is None or value is True:
        return f"[--{flag}]"
    return f"[--{flag} {value}]"


def tool_call(tool: str, **arguments: Any) -> str:
    """The marker for a call of ``tool`` with ``arguments`` (request field names, JSON values;
    those left None dropped), rendered per front end (module docstring)."""
    given = {k: v for k, v in arguments.items() if v is not None}
    return f"[[{tool} {json.dumps(given, separators=(',', ':'))}]]" if given else f"[[{tool}]]"


def mcp_call(tool: str, arguments: dict[str, Any]) -> str:
    """A call as an MCP client would make it: ``validate_kernel {"candidate": "blk.card6:v1"}``."""
    return f"{tool} {json.dumps(arguments)}" if arguments else tool


def _render_marker(match: re.Match[str], front: Front, calls: CallWriter) -> str:
    if match["tool"] is not None:
        try:
            arguments = json.loads(match["arguments"]) if match["arguments"] else {}
        except ValueError:
            return match.group(0)
        return calls(match["tool"], arguments if isinstance(arguments, dict) else {})
    flag, value, negated = match["name"], match["value"], bool(match["no"])
    if front == "cli":
        return match.group(0)[1:-1]
    name = flag.replace("-", "_")
    if negated:
        return f"{name}=false"
    if value is None or _PLACEHOLDER.fullmatch(value):
        return name
    return f"{name}={value}"


def render(text: str, front: Front, calls: CallWriter | None = None) -> str:
    """``text`` with its argument and call markers written for ``front`` (see the module
    docstring); ``calls`` writes a suggested call (default: as over MCP)."""
    return _MARKER.sub(lambda m: _render_marker(m, front, calls or mcp_call), text)


class ModuleLensError(Exception):
    """A problem with the user's input or data, reported without a traceback.

    ``message`` says what is wrong; ``hint`` says what to do about it. Both may hold argument
    markers (module docstring); :meth:`rendered` gives them as one front end shows them.
    """

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def rendered(self, front: Front, calls: CallWriter | None = None) -> tuple[str, str | None]:
        """(message, hint) with markers written for ``front`` (calls by ``calls``, see :func:`render`)."""
        return (render(self.message, front, calls),
                None if self.hint is None else render(self.hint, front, calls))

    def __str__(self) -> str:
        message, hint = self.rendered("args")
        return f"{message} ({hint})" if hint else message


class ReferenceNotFound(ModuleLensError):
    """A name or reference that the repository does not hold."""


class InvalidName(ModuleLensError):
    """A name that could escape the repository or is otherwise malformed."""


class ChecksumMismatch(ModuleLensError):
    """A stored file whose bytes no longer match the sha256 in its manifest."""


class CaptureFailed(ModuleLensError):
    """A capture that did not produce an artifact (no match, script error, ...)."""


class ReplayFailed(ModuleLensError):
    """A replay strategy that could not run."""
