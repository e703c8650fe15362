"""A job process: ``python -m modulelens.jobs.process <repo>/.jobs/<id>.json``.

Runs the one tool call its record names, rewriting the record with its owner, its progress and,
at the end, its result or error. SIGTERM (or the record's cancel marker, present before the
process took the record over) cancels the call: the tool runs inside
:func:`~modulelens.cancellation.cancellable`, so the code waiting on its worker processes kills
them and the tool leaves the repository consistent, and the job ends ``cancelled``. A tool that has
not stopped ``CANCEL_WAIT_S`` after the request is cut short: the job ends ``cancelled`` and the
process kills its own process group (workers started in sessions of their own follow: they watch
their caller, see :func:`~modulelens.workers.watch_caller`).

:func:`run_as_job` is the same run for a call a front end makes in its own process (the CLI's
long calls): the record is the caller's, so the UI and ``job_status`` list it, follow its
progress and can stop it (a SIGTERM to the caller, which cancels the call the same way; past
``CANCEL_WAIT_S`` only the caller is killed, not its process group).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from modulelens.cancellation import CallCancelled, cancellable
from modulelens.errors import ModuleLensError
from modulelens.jobs.table import CANCEL_WAIT_S, LONG_TOOLS, JobRecord, JobTable, cancel_marker, now_iso, write_record
from modulelens.registry import Tool, ToolContext
from modulelens.replies import rendered_reply
from modulelens.repo import this_process


class _Job:
    """The record of the running job, rewritten under a lock (progress comes from any thread)."""

    def __init__(self, path: Path, kill_group: bool = True):
        self.path = path
        self.kill_group = kill_group  # a job process kills its group when it gives up; a caller only itself
        self.record = JobRecord.model_validate_json(path.read_text())
        self.lock = threading.Lock()
        self.ended = False
        self.cancelled = threading.Event()
        self.give_up: threading.Timer | None = None

    def update(self, **fields: Any) -> None:
        with self.lock:
            if self.ended:
                return
            self.record = self.record.model_copy(update=fields)
            self.ended = self.record.state != "running"
            write_record(self.path, self.record)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self.update(progress=done, total=total, message=message if message is not None else self.record.message)

    def cancel(self, *_: object) -> None:
        """Ask the call to stop; cut it short if it has not after ``CANCEL_WAIT_S``."""
        if not self.cancelled.is_set():
            self.cancelled.set()
            self.give_up = threading.Timer(CANCEL_WAIT_S, self._give_up)
            self.give_up.daemon = True
            self.give_up.start()

    def _give_up(self) -> None:
        if self.ended:  # the call stopped in time
            return
        self.update(state="cancelled", ended_at=now_iso(), owner="", error_type="CallCancelled",
                    error=f"cancelled: the tool did not stop within {CANCEL_WAIT_S:.0f} s of the request and was "
                          "killed")
        if self.kill_group:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def end(self, result: Any = None, error: BaseException | None = None) -> None:
        """Record how the call ended: its result, or ``error`` (cancelled when it was stopped)."""
        if self.give_up is not None:
            self.give_up.cancel()
        if error is None:
            final: dict[str, Any] = {"state": "done", "result": rendered_reply(result, "args")}
        elif isinstance(error, ModuleLensError | KeyboardInterrupt):
            stopped = isinstance(error, CallCancelled | KeyboardInterrupt) or self.cancelled.is_set()
            message = error.message if isinstance(error, ModuleLensError) else "interrupted (Ctrl-C)"
            final = {"state": "cancelled" if stopped else "failed", "error": message,
                     "hint": getattr(error, "hint", None), "error_type": type(error).__name__}
        else:
            final = {"state": "failed", "error_type": "internal error", "error": f"{type(error).__name__}: {error}",
                     "hint": "see the job's log"}
        self.update(**final, owner="", ended_at=now_iso())


def run_job(path: Path) -> None:
    """Run the job whose record is ``path`` to its end, keeping the record current."""
    from modulelens.tools import get_tool

    job = _Job(path)
    signal.signal(signal.SIGTERM, job.cancel)
    job.update(owner=this_process())
    if cancel_marker(path).exists():  # asked to stop before this process could be signalled
        job.cancel()
    try:
        tool = get_tool(job.record.tool)
        request = tool.request.model_validate(job.record.arguments)
        ctx = ToolContext(repo_root=path.parent.parent, progress=job.progress, stdout_is_protocol=True,
                          cancelled=job.cancelled)
        with cancellable(job.cancelled):
            result = tool(request, ctx)
    except BaseException as exc:  # noqa: BLE001 - a job must always end with a state
        if not isinstance(exc, ModuleLensError):
            traceback.print_exc()
        job.end(error=exc)
        return
    job.end(result)


def run_as_job(tool: Tool, request: BaseModel, ctx: ToolContext) -> Any:
    """``tool.fn(request, ctx)`` in this process; for one of ``LONG_TOOLS``, shown as a job of
    ``ctx``'s repository meanwhile (see the module docstring) when that repository exists (a
    mistyped ``--repo`` is not created): ``ctx`` gets the job's progress (besides its own) and
    cancellation, and the record ends with the result or the error, which is raised here as
    without a job."""
    if tool.name not in LONG_TOOLS or not Path(ctx.repo_root).is_dir():
        return tool.fn(request, ctx)
    job = _Job(JobTable(ctx.repo_root).attach(tool.name, request.model_dump(mode="json", exclude_unset=True)),
               kill_group=False)
    shown = ctx.progress

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        shown(done, total, message)
        job.progress(done, total, message)

    ctx.progress, ctx.cancelled = progress, job.cancelled
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, job.cancel) if main else None
    try:
        with cancellable(job.cancelled):
            result = tool.fn(request, ctx)
    except BaseException as exc:
        job.end(error=exc)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    job.end(result)
    return result


if __name__ == "__main__":
    run_job(Path(sys.argv[1]))
