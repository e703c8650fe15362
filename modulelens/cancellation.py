"""Cancelling a tool call that is running in a thread, down to the processes it started.

A front end that can cancel a call (the MCP server, when the client sends
``notifications/cancelled`` or the job table's ``job_status`` with ``cancel``) gives the call a
:class:`threading.Event` (``ToolContext.cancelled``) and runs the tool inside
:func:`cancellable`. The code that waits on a worker process (the capture, statistics and run
workers, the sandbox) polls :func:`cancel_requested` while it waits, and on a request kills the
worker's whole process group and raises :class:`CallCancelled`. Code that runs outside
:func:`cancellable` (the CLI, the Python API) is never cancelled this way: Ctrl-C is its
cancellation, and the same waiting code kills its worker on any exception.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator

from modulelens.errors import ModuleLensError

_CURRENT: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("modulelens_cancel", default=None)


class CallCancelled(ModuleLensError):
    """The call was cancelled by its caller; its worker process was stopped."""

    def __init__(self, what: str):
        super().__init__(f"cancelled: {what} was stopped at the caller's request", None)


@contextlib.contextmanager
def cancellable(event: threading.Event) -> Iterator[threading.Event]:
    """Within this block (in this thread and what it copies the context to), setting ``event``
    asks every waiting worker to stop."""
    token = _CURRENT.set(event)
    try:
        yield event
    finally:
        _CURRENT.reset(token)


def cancel_requested() -> bool:
    """True when the current call has been cancelled (False outside :func:`cancellable`)."""
    event = _CURRENT.get()
    return event is not None and event.is_set()


