"""Progress while a user's script runs in a worker: the last line it printed, as the message of
the call's progress (``running train.py: step 2 loss 3.1``), at most one report every
:data:`MIN_GAP_S` so a chatty script does not flood the client with notifications. Only where no
person reads the relayed output itself (MCP, its jobs, the UI): in the CLI the script's lines are
on the terminal already, and a progress line repeating them would print them twice."""

from __future__ import annotations

import time
from collections.abc import Callable

from modulelens.registry import ToolContext

MIN_GAP_S = 0.5
MAX_LINE_CHARS = 80


class ScriptLines:
    """An ``on_line`` listener (see :func:`modulelens.workers.launch_worker`) that reports
    ``f"{head}: {line}"`` through ``progress(done, total, message)`` at fraction ``done/total``."""

    def __init__(self, progress: Callable[[float, float | None, str | None], None], done: float,
                 total: float | None, head: str):
        self._progress, self._done, self._total, self._head = progress, done, total, head
        self._last = 0.0

    def __call__(self, line: str) -> None:
        text = line.strip()
        now = time.monotonic()
        if not text or now - self._last < MIN_GAP_S:
            return
        self._last = now
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS - 1] + "…"
        self._progress(self._done, self._total, f"{self._head}: {text}")


def script_lines(ctx: ToolContext, done: float, total: float | None, head: str) -> ScriptLines | None:
    """The ``on_line`` listener for a script run in ``ctx``'s call, or None where a person reads the
    script's output as it is relayed (see the module docstring)."""
    return None if ctx.person_reads_stderr else ScriptLines(ctx.progress, done, total, head)
