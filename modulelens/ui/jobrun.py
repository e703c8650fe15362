"""The child process of a UI job: ``python -m modulelens.ui.jobrun`` with a
:class:`~modulelens.ui.jobs.JobSpec` on stdin.

It runs the one tool the spec names and writes :class:`~modulelens.ui.jobs.JobEvent` lines on its
stdout: progress as it comes, then the result or the error. Before the tool runs, stdout is moved
to a private descriptor and fd 1 points at stderr, so nothing the tool or a user's script prints
can be mistaken for an event. SIGTERM ends the tool with SystemExit, so its workers are closed.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TextIO

from modulelens.ui.jobs import JobEvent, JobSpec


def _private_stdout() -> TextIO:
    wire = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return wire


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    spec = JobSpec.model_validate_json(sys.stdin.read())
    wire = _private_stdout()

    def emit(event: JobEvent) -> None:
        wire.write(event.model_dump_json() + "\n")
        wire.flush()

    from modulelens.errors import ModuleLensError, render
    from modulelens.registry import ToolContext
    from modulelens.tools import get_tool
    from modulelens.ui.jobs import UI_FRONT

    ctx = ToolContext(
        repo_root=Path(spec.repo_root), stdout_is_protocol=True,
        progress=lambda done, total=None, message=None: emit(
            JobEvent(kind="progress", done=done, total=total, message=message)),
    )
    try:
        tool = get_tool(spec.tool)
        result = tool(tool.request.model_validate(spec.request), ctx)
    except ModuleLensError as exc:
        message, hint = exc.rendered(UI_FRONT)
        emit(JobEvent(kind="error", error=message, hint=hint))
        return 1
    except Exception as exc:  # noqa: BLE001  (the page must always get a result)
        traceback.print_exc()
        emit(JobEvent(kind="error", error=render(f"{type(exc).__name__}: {exc}", UI_FRONT), hint="see the job's log"))
        return 1
    emit(JobEvent(kind="result", result=result.model_dump(mode="json")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
