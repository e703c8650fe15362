"""What a person sees while a tool works: the CLI's ``ToolContext.progress``.

:class:`ProgressReporter` is the progress function handed to the tool and a context manager around
its run. Its mode (:func:`progress_mode`):

- ``live``: a rich progress line on stderr (spinner, message, a bar when the total is known, the
  elapsed time) when stderr is an interactive terminal; it disappears when the tool ends.
- ``plain``: one line per update on stderr, ``validate-kernel: compile [1/5, 3 s]``, for pipes, logs
  and CI; at most one every :data:`MIN_GAP_S`, plus a heartbeat line (the last message with the
  elapsed time) when nothing new came for a while, and ``validate-kernel: done in 12 s`` at the end.
- ``off``: nothing at all (``--json``, ``--quiet``).

Nothing is shown for waits shorter than :data:`SHOW_AFTER_S`. A tool that reports nothing still
gets the display (``capture-ops: working [4 s]``), so every wait over a second is visible without
the tool having to report. Progress never breaks a tool: a failing display turns itself off.
"""

from __future__ import annotations

import enum
import sys
import threading
import time
from types import TracebackType
from typing import Any, Self

from rich.console import Console
from rich.markup import escape

__all__ = ["ProgressMode", "ProgressReporter", "progress_line", "progress_mode"]

SHOW_AFTER_S = 1.0  # nothing is shown for shorter waits
MIN_GAP_S = 0.5  # plain mode: at most one line per this many seconds
TICK_S = 0.1  # how often the background thread looks at the clock
IDLE_MESSAGE = "working"


def heartbeat_after(elapsed: float) -> float:
    """Seconds without news before plain mode repeats the last message: 2 s in the first 20 s of a
    run, then 10 s (a long run does not flood a log)."""
    return 2.0 if elapsed < 20 else 10.0


class ProgressMode(enum.Enum):
    OFF = "off"
    PLAIN = "plain"
    LIVE = "live"


def progress_mode(*, quiet: bool, as_json: bool) -> ProgressMode:
    """``off`` with ``--quiet`` or ``--json``; ``live`` when stderr is an interactive terminal;
    ``plain`` otherwise. Progress is drawn on stderr, so stderr is what decides (stdout may be piped
    into a file while the person still watches the terminal)."""
    if quiet or as_json:
        return ProgressMode.OFF
    return ProgressMode.LIVE if Console(stderr=True).is_interactive else ProgressMode.PLAIN


def progress_line(label: str, message: str | None, done: float, total: float | None, elapsed: float) -> str:
    """One plain-mode line: ``label: message [done/total, N s]`` (the count only when total > 1)."""
    count = f"{done:g}/{total:g}, " if total is not None and total > 1 else ""
    return f"{label}: {message or IDLE_MESSAGE} [{count}{elapsed:.0f} s]"


class ProgressReporter:
    """``ToolContext.progress`` for one CLI command (see the module docstring). Callable from any
    thread; use it as a context manager around the tool's run."""

    def __init__(self, label: str, mode: ProgressMode):
        self.label = label
        self.mode = mode
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._state: tuple[float, float | None, str | None] = (0.0, None, None)
        self._shown = False  # past SHOW_AFTER_S: updates are drawn
        self._pending = False  # plain mode: an update not written yet
        self._last_line_at = 0.0
        self._live: Any = None  # rich Progress in live mode
        self._task: Any = None

    # -- the tool's side ---------------------------------------------------------------------

    def __call__(self, done: float, total: float | None = None, message: str | None = None) -> None:
        if self.mode is ProgressMode.OFF:
            return
        with self._lock:
            self._state = (done, total, message if message is not None else self._state[2])
            self._pending = True
            if self._shown:
                self._draw(time.monotonic())

    # -- the context --------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._started = time.monotonic()
        if self.mode is not ProgressMode.OFF:
            self._thread = threading.Thread(target=self._run, name="modulelens-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._live is not None:
                self._guarded(self._live.stop)
                self._live = None
            elif self._shown and self.mode is ProgressMode.PLAIN and exc_type is None:
                self._write(f"{self.label}: done in {time.monotonic() - self._started:.0f} s")

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                now = time.monotonic()
                if not self._shown and now - self._started >= SHOW_AFTER_S:
                    self._shown = True
                    self._pending = True
                if self._shown:
                    self._draw(now)

    # -- drawing ------------------------------------------------------------------------------

    def _draw(self, now: float) -> None:
        if self.mode is ProgressMode.OFF:
            return
        if self.mode is ProgressMode.LIVE:
            self._guarded(self._update_live)
            return
        since_line = now - self._last_line_at
        elapsed = now - self._started
        if (self._pending and since_line >= MIN_GAP_S) or since_line >= heartbeat_after(elapsed):
            self._write(progress_line(self.label, self._state[2], self._state[0], self._state[1], elapsed))
            self._last_line_at = now
            self._pending = False

    def _write(self, line: str) -> None:
        def write() -> None:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

        self._guarded(write)

    def _update_live(self) -> None:
        done, total, message = self._state
        description = escape(f"{self.label}: {message or IDLE_MESSAGE}")
        elapsed = f"{time.monotonic() - self._started:.0f} s"  # the tool's clock, not the display's
        if self._live is None:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn

            self._live = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                  TextColumn("{task.fields[elapsed]}", style="yellow"), console=Console(stderr=True),
                                  transient=True)
            self._task = self._live.add_task(description, total=total, completed=done, elapsed=elapsed)
            self._live.start()
        self._live.update(self._task, completed=done, total=total, description=description, elapsed=elapsed)

    def _guarded(self, draw: Any) -> None:
        try:
            draw()
        except Exception:  # noqa: BLE001  (progress must never break a tool)
            self.mode = ProgressMode.OFF
            self._live = None
