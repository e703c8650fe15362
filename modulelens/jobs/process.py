"""A job process: ``python -m modulelens.jobs.process <repo>/.jobs/<id>.json``.

Runs the one tool call its record names, rewriting the record with its owner, its progress and,
at the end, its result or error. SIGTERM (or the record's cancel marker, present before the
process took the record over) cancels the call: the tool runs inside
:func:`~modulelens.cancellation.cancellable`, so the code waiting on its worker processes kills
them and the tool leaves the repository consistent, and the job ends ``cancelled``. A tool that has
not stopped ``CANCEL_WAIT_S`` after the request is cut short: the job ends ``cancelled`` and the
process kills its own process group (workers started in sessions of their own follow: they watch
their caller, see :func:`~modulelens.workers.watch_caller`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from modulelens.cancellation import CallCancelled, cancellable
from modulelens.errors import ModuleLensError
from modulelens.jobs.table import CANCEL_WAIT_S, JobRecord, cancel_marker, now_iso, write_record
from modulelens.registry import ToolContext
from modulelens.replies import rendered_reply
from modulelens.repo.owners import this_process


class _Job:
    """The record of the running job, rewritten under a lock (progress comes from any thread)."""

    def __init__(self, path: Path):
        self.path = path
        self.record = JobRecord.model_validate_json(path.read_text())
        self.lock = threading.Lock()
        self.ended = False
        self.cancelled = threading.Event()

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
            timer = threading.Timer(CANCEL_WAIT_S, self._give_up)
            timer.daemon = True
            timer.start()

    def _give_up(self) -> None:
        self.update(state="cancelled", ended_at=now_iso(), owner="", error_type="CallCancelled",
                    error=f"cancelled: the tool did not stop within {CANCEL_WAIT_S:.0f} s of the request and was "
                          "killed")
        os.killpg(os.getpgrp(), signal.SIGKILL)


def run_job(path: Path) -> None:
    """Run the job whose record is ``path`` to its end, keeping the record current."""
    from modulelens.tools import get_tool

    job = _Job(path)
    signal.signal(signal.SIGTERM, job.cancel)
    job.update(owner=this_process())
    if cancel_marker(path).exists():  # asked to stop before this process could be signalled
        job.cancel()
    final: dict[str, Any]
    try:
        tool = get_tool(job.record.tool)
        request = tool.request.model_validate(job.record.arguments)
        ctx = ToolContext(repo_root=path.parent.parent, progress=job.progress, stdout_is_protocol=True,
                          cancelled=job.cancelled)
        with cancellable(job.cancelled):
            result = tool(request, ctx)
        final = {"state": "done", "result": rendered_reply(result, "args")}
    except ModuleLensError as exc:
        stopped = isinstance(exc, CallCancelled) or job.cancelled.is_set()
        final = {"state": "cancelled" if stopped else "failed", "error": exc.message, "hint": exc.hint,
                 "error_type": type(exc).__name__}
    except BaseException as exc:  # noqa: BLE001 - a job must always end with a state
        traceback.print_exc()
        final = {"state": "failed", "error_type": "internal error", "error": f"{type(exc).__name__}: {exc}",
                 "hint": "see the job's log"}
    job.update(**final, owner="", ended_at=now_iso())


if __name__ == "__main__":
    run_job(Path(sys.argv[1]))
