"""Errors that reach users: each says what is wrong and how to fix it.

Messages and hints name tool arguments with a marker that each front end renders its own way:
``[--target CARD]`` is ``--target CARD`` in the CLI and ``target`` over MCP and in Python;
``[--strategy export]`` is ``--strategy export`` / ``strategy=export``; ``[--no-eager]`` is
``--no-eager`` / ``eager=false``; ``[--trust-pickle]`` is ``--trust-pickle`` / ``trust_pickle``.
A value written in capitals (``CARD``, ``FILE``, ``N``) is a placeholder, shown only in the CLI.
Write markers with :func:`arg` or by hand; :func:`render` turns them into one front end's text.
The raw text (``ModuleLensError.message`` and ``.hint``) keeps the markers, so an error can cross
a process boundary and still be rendered by whichever front end shows it.
"""

from __future__ import annotations

import re
from typing import Literal

Front = Literal["cli", "args"]
"""How argument markers read: ``cli`` as command-line flags, ``args`` as argument names (MCP, Python)."""

_MARKER = re.compile(r"\[--(?P<no>no-)?(?P<name>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?: (?P<value>[^\[\]]+))?\]")
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


def _render_marker(match: re.Match[str], front: Front) -> str:
    flag, value, negated = match["name"], match["value"], bool(match["no"])
    if front == "cli":
        return match.group(0)[1:-1]
    name = flag.replace("-", "_")
    if negated:
        return f"{name}=false"
    if value is None or _PLACEHOLDER.fullmatch(value):
        return name
    return f"{name}={value}"


def render(text: str, front: Front) -> str:
    """``text`` with its argument markers written for ``front`` (see the module docstring)."""
    return _MARKER.sub(lambda m: _render_marker(m, front), text)


class ModuleLensError(Exception):
    """A problem with the user's input or data, reported without a traceback.

    ``message`` says what is wrong; ``hint`` says what to do about it. Both may hold argument
    markers (module docstring); :meth:`rendered` gives them as one front end shows them.
    """

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def rendered(self, front: Front) -> tuple[str, str | None]:
        """(message, hint) with argument markers written for ``front``."""
        return render(self.message, front), None if self.hint is None else render(self.hint, front)

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
