"""Start-then-poll for calls that outlast a client's request timeout.

MCP clients give up on a request after a fixed time (the MCP Inspector after 60 s, and it starts
a new server for every command), and a cold C++ build, a capture or a statistics run can take
longer. The SDK's server has no task support such clients can drive, so the server offers three
tools of its own:

* ``start_job(tool, arguments)`` validates the arguments as ``tool`` would, starts the call in a
  job process of its own and answers at once with the job's id;
* ``job_status(job, wait)`` says how the job stands (state, last progress message, seconds
  elapsed), waiting up to ``wait`` seconds for it to finish; a finished job carries the tool's
  result (``result``, as the tool returns it) or its error text;
* ``job_status(job, cancel=true)`` stops the job first: its worker processes are killed as for a
  cancelled call (see :mod:`modulelens.cancellation`), and it ends ``cancelled``.

A job is a detached process (``python -m modulelens.mcp_server.job_runner``) that writes its
status to ``<repo>/.jobs/<id>.json``, so it survives the server that started it and any server on
the same repository can report on it or cancel it. A job's files are removed a week after it ended. Sampling is not available inside a job (there
is no request to carry it): generate with the ``sampling`` provider by a direct call.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from modulelens.arguments import parse_json_text, unknown_names
from modulelens.errors import ModuleLensError
from modulelens.mcp_server.calls import validation_text
from modulelens.registry import Tool, ToolContext, ToolRegistry, tool
from modulelens.replies import NextCall, ToolReply, call
from modulelens.repo import default_repo_root
from modulelens.repo.owners import owner_alive

# The tools that may outlast a client's request timeout: the job tools are offered for these.
LONG_TOOLS = ("capture_module", "gather_stats", "validate_kernel", "generate_kernel",
              "optimize", "capture_ops", "profile", "export_repro", "replay_module", "run")
JOBS_DIR = ".jobs"
MAX_WAIT_S = 50.0  # below the common 60 s client request timeout
CANCEL_WAIT_S = 30.0
KEEP_FINISHED_S = 7 * 24 * 3600.0  # a finished job's files are removed by a later start_job after this
POLL_S = 0.25

JobState = Literal["running", "done", "failed", "cancelled"]


class JobRequest(BaseModel):
    """What a job process runs (``<id>.request.json``)."""

    job: str
    tool: str
    arguments: dict[str, Any]
    repo: str


class JobStatus(ToolReply):
    """Where a background job stands (``<id>.json``, rewritten by the job process)."""

    job: str = Field(description="Job id, for job_status.")
    tool: str
    state: JobState
    started_at: str = Field(description="ISO time the job started.")
    elapsed_s: float = 0.0
    progress: float | None = None
    total: float | None = None
    message: str | None = Field(None, description="The tool's last progress message.")
    result: dict[str, Any] | None = Field(None, description="The tool's result, once done.")
    error: str | None = Field(None, description="Why it failed, once failed or cancelled.")
    owner: str = Field("", description="The job process (pid.start), while it runs.")


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def write_status(path: Path, status: JobStatus) -> None:
    """Write ``status`` to ``path`` atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(status.model_dump_json())
    os.replace(tmp, path)


class JobTable:
    """The jobs of one repository (``<repo>/.jobs``)."""

    def __init__(self, repo_root: Path | None):
        self._repo_root = repo_root

    @property
    def folder(self) -> Path:
        root = self._repo_root if self._repo_root is not None else default_repo_root()
        return Path(root) / JOBS_DIR

    def start(self, tool: Tool, arguments: dict[str, Any]) -> JobStatus:
        """Start ``tool`` on ``arguments`` (already validated) in a detached job process."""
        folder = self.folder
        folder.mkdir(parents=True, exist_ok=True)
        self._forget_old(folder)
        job_id = f"{tool.name}-{secrets.token_hex(4)}"
        request = JobRequest(job=job_id, tool=tool.name, arguments=arguments, repo=str(folder.parent))
        (folder / f"{job_id}.request.json").write_text(request.model_dump_json())
        status = JobStatus(job=job_id, tool=tool.name, state="running", started_at=now_iso(), message="starting")
        write_status(folder / f"{job_id}.json", status)
        with open(folder / f"{job_id}.log", "wb") as log:
            subprocess.Popen([sys.executable, "-m", "modulelens.mcp_server.job_runner", str(folder / job_id)],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
        return status

    def status(self, job_id: str) -> JobStatus:
        """The job's status; a job whose process died without a final status is ``failed``."""
        path = self._status_path(job_id)
        status = JobStatus.model_validate_json(path.read_text())
        if status.state == "running":
            started = _dt.datetime.fromisoformat(status.started_at)
            status.elapsed_s = round((_dt.datetime.now(_dt.UTC) - started).total_seconds(), 1)
            if status.owner and not owner_alive(status.owner):
                status = JobStatus.model_validate_json(path.read_text())  # it may have just finished
                if status.state == "running":
                    status.state, status.error = "failed", "the job process ended without a result (killed?)"
        return status

    def wait(self, job_id: str, seconds: float) -> JobStatus:
        """The job's status once it finished, or after ``seconds``."""
        deadline = time.monotonic() + seconds
        status = self.status(job_id)
        while status.state == "running" and time.monotonic() < deadline:
            time.sleep(POLL_S)
            status = self.status(job_id)
        return status

    def cancel(self, job_id: str) -> JobStatus:
        """Ask the job process to stop (SIGTERM: it cancels its call, which kills its workers) and
        wait for it; a job process that does not stop in ``CANCEL_WAIT_S`` is killed."""
        status = self.status(job_id)
        if status.state != "running" or not status.owner:
            return status
        pid = int(status.owner.partition(".")[0])
        _signal(pid, signal.SIGTERM)
        status = self.wait(job_id, CANCEL_WAIT_S)
        if status.state == "running":
            _signal(pid, signal.SIGKILL, group=True)
            status = self.wait(job_id, 5.0)
        return status

    @staticmethod
    def _forget_old(folder: Path) -> None:
        """Remove the files of jobs that finished more than ``KEEP_FINISHED_S`` ago."""
        now = time.time()
        for path in folder.glob("*.json"):
            if path.name.endswith(".request.json"):
                continue
            try:
                old = now - path.stat().st_mtime > KEEP_FINISHED_S
                if old and JobStatus.model_validate_json(path.read_text()).state != "running":
                    for suffix in (".json", ".request.json", ".log"):
                        path.with_name(path.stem + suffix).unlink(missing_ok=True)
            except (OSError, ValueError):
                continue

    def _status_path(self, job_id: str) -> Path:
        path = self.folder / f"{job_id}.json"
        if "/" in job_id or job_id.startswith(".") or not path.is_file():
            known = sorted(p.stem for p in self.folder.glob("*.json") if not p.name.endswith(".request.json"))
            raise ModuleLensError(f"no job {job_id!r}", f"jobs: {', '.join(known[-10:])}" if known
                                  else "start one with start_job")
        return path


def _signal(pid: int, sig: signal.Signals, *, group: bool = False) -> None:
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class StartJobRequest(BaseModel):
    tool: str = Field(description="A long tool (capture_module, validate_kernel, ...).")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Its arguments.")


class JobStatusRequest(BaseModel):
    job: str = Field(description="Job id from start_job.")
    wait: float = Field(0.0, ge=0, le=MAX_WAIT_S, description="Seconds to wait for it to end.")
    cancel: bool = Field(False, description="Stop it first.")


def job_tools(tools: ToolRegistry) -> list[Tool]:
    """``start_job`` and ``job_status`` as tools (served like the registry's, on
    the repository of the call's context), for those of ``tools`` named in ``LONG_TOOLS``; none
    when there is none of them."""
    long_tools = {t.name: t for t in tools if t.name in LONG_TOOLS}
    if not long_tools:
        return []

    @tool
    def start_job(request: StartJobRequest, ctx: ToolContext) -> JobStatus:
        """Run a long tool call in the background; returns a job id at once."""
        chosen = long_tools.get(request.tool)
        if chosen is None:
            raise ModuleLensError(f"start_job cannot run {request.tool!r}",
                                  f"it runs: {', '.join(sorted(long_tools))}")
        arguments = parse_json_text(chosen.request, request.arguments)
        unknown = unknown_names(chosen.request, arguments)
        if unknown is not None:
            raise ModuleLensError(f"invalid arguments for {chosen.name}: {unknown}", None)
        try:
            checked = chosen.request.model_validate(arguments)
        except ValidationError as exc:
            raise ModuleLensError(validation_text(exc), None) from None
        return advised(JobTable(ctx.repo_root).start(chosen, checked.model_dump(mode="json", exclude_unset=True)))

    @tool
    def job_status(request: JobStatusRequest, ctx: ToolContext) -> JobStatus:
        """How a background job stands (or stop it); once ended, its result or error."""
        table = JobTable(ctx.repo_root)
        if request.cancel:
            return advised(_answer(lambda job_id, _: table.cancel(job_id), request.job, 0.0))
        return advised(_answer(table.wait, request.job, request.wait))

    return [start_job, job_status]


def advised(status: JobStatus) -> JobStatus:
    """``status`` with its next call: poll a running job; once done, the next calls of its result."""
    if status.state == "running":
        status.next = [call("job_status", job=status.job, wait=MAX_WAIT_S)]
    elif status.state == "done" and status.result:
        status.next = [NextCall.model_validate(n) for n in status.result.get("next", [])]
    else:
        status.warnings = [f"the job {status.state}: {status.error or 'no reason recorded'}"]
    return status


def _answer(ask: Any, job_id: str, seconds: float) -> JobStatus:
    try:
        return ask(job_id, seconds)
    except (OSError, ValueError) as exc:
        raise ModuleLensError(f"cannot read job {job_id!r}: {exc}", None) from exc


def load_request(base: Path) -> JobRequest:
    return JobRequest.model_validate(json.loads(base.with_name(base.name + ".request.json").read_text()))
