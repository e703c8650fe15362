"""A job process: ``python -m modulelens.mcp_server.job_runner <repo>/.jobs/<id>``.

Runs one tool call described by ``<id>.request.json`` (see :mod:`modulelens.mcp_server.jobs`),
rewriting ``<id>.json`` with its progress and, at the end, its result or error. SIGTERM cancels
the call: the tool runs inside :func:`~modulelens.cancellation.cancellable`, so its worker
processes are killed and the repository is left consistent, and the job ends ``cancelled``.
"""

from __future__ import annotations

import datetime as _dt
import signal
import sys
import threading
from pathlib import Path

from modulelens.cancellation import CallCancelled, cancellable
from modulelens.errors import ModuleLensError
from modulelens.mcp_server.calls import error_text
from modulelens.mcp_server.jobs import JobStatus, load_request, write_status
from modulelens.registry import ToolContext
from modulelens.replies import rendered_reply
from modulelens.repo.owners import this_process


def run_job(base: Path) -> None:
    """Run the job at ``base`` (``<repo>/.jobs/<id>``) to its end, keeping its status file current."""
    from modulelens.tools import get_tool

    status_path = base.with_name(base.name + ".json")
    status = JobStatus.model_validate_json(status_path.read_text())
    status.owner = this_process()
    write_status(status_path, status)
    cancelled = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancelled.set())
    lock = threading.Lock()

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        with lock:
            status.progress, status.total = done, total
            status.message = message if message is not None else status.message
            write_status(status_path, status)

    final: dict[str, object]
    try:
        job = load_request(base)
        tool = get_tool(job.tool)
        request = tool.request.model_validate(job.arguments)
        ctx = ToolContext(repo_root=Path(job.repo), progress=progress, stdout_is_protocol=True,
                          cancelled=cancelled)
        with cancellable(cancelled):
            result = tool.fn(request, ctx)
        final = {"state": "done", "result": rendered_reply(result, "args")}  # read over MCP
    except CallCancelled as exc:
        final = {"state": "cancelled", "error": error_text(exc)}
    except ModuleLensError as exc:
        final = {"state": "cancelled" if cancelled.is_set() else "failed", "error": error_text(exc)}
    except BaseException as exc:  # noqa: BLE001 - a job must always end with a state
        final = {"state": "failed", "error": f"internal error: {type(exc).__name__}: {exc}"}
    started = _dt.datetime.fromisoformat(status.started_at)
    elapsed = round((_dt.datetime.now(_dt.UTC) - started).total_seconds(), 1)
    with lock:
        write_status(status_path, status.model_copy(update={**final, "owner": "", "elapsed_s": elapsed}))


if __name__ == "__main__":
    run_job(Path(sys.argv[1]))
