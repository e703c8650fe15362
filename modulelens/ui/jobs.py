"""Actions the UI can start (replay a capture, validate a candidate, gather statistics), each run
as a background job: one tool from the registry, called in a child process so that it can be
stopped at any time, with its progress and result kept for the page to poll.

Only the actions in :data:`ACTIONS` can be started, each with a fixed set of request fields: the
web layer cannot reach a tool that writes outside the repository (install_skills) or runs an
arbitrary file. A script for gather_stats must be a ``.py`` file inside the project folder (where
the server was started). ``continue_search`` runs optimize again on a stored search: its targets,
provider, backend and settings as stored, with ``more`` evaluations beyond the nodes it has.

The child (:mod:`modulelens.ui.jobrun`) reads a :class:`JobSpec` on stdin and writes
:class:`JobEvent` lines on stdout; whatever the tool or the user's script prints goes to stderr,
whose last lines the job keeps. Stopping sends SIGTERM to the child's process group (the child
then closes its own workers), and SIGKILL after a grace period.
"""

from __future__ import annotations

import collections
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from modulelens.arguments import argument_errors
from modulelens.errors import Front, ModuleLensError, ReferenceNotFound
from modulelens.listing import everything
from modulelens.tools import get_tool

STOP_GRACE_S = 5.0
LOG_LINES = 40
UI_FRONT: Front = "args"
"""How argument markers in errors read in the UI: as argument names, which are the names of the
pages' form fields (``strategy``, ``script_args``, ``every``)."""

JobStateName = Literal["running", "done", "failed", "stopped"]


class JobSpec(BaseModel):
    """What the child process runs: one tool, one request, one repository."""

    tool: str
    request: dict[str, Any]
    repo_root: str


class JobEvent(BaseModel):
    """One line the child writes: progress, the final result, or the final error."""

    kind: Literal["progress", "result", "error"]
    done: float | None = None
    total: float | None = None
    message: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    hint: str | None = None


class Job(BaseModel):
    id: str
    action: str
    tool: str
    label: str = Field(description="What the job does, for people.")
    subject: str = Field(description="What it acts on (a capture or candidate reference, a script).")
    request: dict[str, Any]
    state: JobStateName = "running"
    started_at: float
    ended_at: float | None = None
    progress: float | None = Field(None, description="0..1 when the tool reports a total.")
    message: str = ""
    result: dict[str, Any] | None = None
    error: str | None = None
    hint: str | None = None
    log_tail: list[str] = Field(default_factory=list, description="Last lines the job printed (stderr).")


@dataclass(frozen=True)
class Action:
    """An action the UI offers: which tool, which request fields the page may set, which field
    names the subject, and how the page's values are checked before the tool sees them."""

    name: str
    tool: str
    label: str  # with {subject}
    fields: frozenset[str]
    required: frozenset[str]
    subject: Callable[[dict[str, Any]], str]
    prepare: Callable[[dict[str, Any], JobRunner], dict[str, Any]] | None = None


def _script_inside(params: dict[str, Any], runner: JobRunner) -> dict[str, Any]:
    """gather_stats: a script given must be a .py file inside the project; its arguments may come
    as one string (split like a shell would)."""
    project = runner.project_root
    out = dict(params)
    if out.get("script"):
        rel = str(out["script"])
        path = (project / rel).resolve()
        if not path.is_relative_to(project.resolve()) or path.suffix != ".py" or not path.is_file():
            raise ReferenceNotFound(f"no script {rel!r} in the project folder {project}",
                                    "give the path of a .py training script inside it, e.g. examples/faults/train.py")
        out["script"] = str(path)
    if isinstance(out.get("script_args"), str):
        out["script_args"] = shlex.split(out["script_args"])
    return out


DEFAULT_MORE_EVALS = 4


def _continue_search(params: dict[str, Any], runner: JobRunner) -> dict[str, Any]:
    """optimize's request that resumes the stored search ``search_id`` (see the module docstring)."""
    from modulelens.registry import ToolContext

    show = get_tool("show")
    summary = show(show.request.model_validate({**everything(show.request), "kind": "search",
                                                "ref": params["search_id"]}), ToolContext(repo_root=runner.repo_root))
    try:
        more = int(params.get("more", DEFAULT_MORE_EVALS))
    except (TypeError, ValueError):
        raise ModuleLensError(f"more must be a whole number of evaluations, not {params.get('more')!r}",
                              "e.g. 4") from None
    if not 1 <= more <= 1000:
        raise ModuleLensError(f"more must be between 1 and 1000 evaluations, not {more}", "e.g. 4")
    nodes = sum(max(len(t.nodes) - 1, t.outcome.nodes if t.outcome else 0) for t in summary.targets)
    s = summary.settings
    return {"targets": [t.target for t in summary.targets], "search_id": summary.search_id,
            "provider": s.provider, "backend": s.backend, "max_evals": nodes + more, "time_budget": s.time_budget_s,
            "max_cost": s.max_cost_usd, "roofline_target": s.roofline_target, "patience": s.patience,
            "compile_baseline": s.compile_baseline}


ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("replay", "replay_module", "replay {subject}", frozenset({"ref", "strategy"}), frozenset({"ref"}),
           lambda p: str(p["ref"])),
    Action("validate", "validate_kernel", "validate {subject}", frozenset({"candidate"}), frozenset({"candidate"}),
           lambda p: str(p["candidate"])),
    Action("gather_stats", "gather_stats", "gather statistics of {subject}",
           frozenset({"script", "script_args", "capture", "every", "steps", "name"}), frozenset(),
           lambda p: str(p.get("capture") or p.get("script") or ""), _script_inside),
    Action("continue_search", "optimize", "continue search {subject}", frozenset({"search_id", "more"}),
           frozenset({"search_id"}), lambda p: str(p["search_id"]), _continue_search),
)}


def _describe(exc: ValidationError) -> str:
    return "; ".join(argument_errors(exc, front=UI_FRONT))


class _Running:
    """The live side of a job: its process and the thread reading it."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        self.stop_requested = False
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_LINES)


class JobRunner:
    """Starts, tracks and stops jobs. Thread-safe; keeps the last ``keep`` jobs."""

    def __init__(self, repo_root: Path, project_root: Path, keep: int = 100):
        self.repo_root = repo_root
        self.project_root = project_root
        self.keep = keep
        self._jobs: dict[str, Job] = {}
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()

    # -- reading ------------------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        """Snapshots of the jobs, newest first."""
        with self._lock:
            return [j.model_copy(deep=True) for j in reversed(self._jobs.values())]

    def get(self, job_id: str) -> Job:
        with self._lock:
            if job_id not in self._jobs:
                raise ReferenceNotFound(f"no job {job_id!r}", "jobs are kept while the server runs")
            return self._jobs[job_id].model_copy(deep=True)

    # -- starting -----------------------------------------------------------------------------
    def start(self, action_name: str, params: dict[str, Any]) -> Job:
        """Start ``action_name`` with ``params`` (checked against the action's fields and the
        tool's request model here, so a bad value is a clear error before anything runs)."""
        action = ACTIONS.get(action_name)
        if action is None:
            raise ModuleLensError(f"no action {action_name!r}", f"actions: {', '.join(ACTIONS)}")
        unknown = set(params) - action.fields
        if unknown:
            raise ModuleLensError(f"action {action_name!r} takes no {', '.join(sorted(unknown))}",
                                  f"it takes: {', '.join(sorted(action.fields))}")
        values = {k: v for k, v in params.items() if v not in (None, "")}
        missing = action.required - set(values)
        if missing:
            raise ModuleLensError(f"action {action_name!r} needs {', '.join(sorted(missing))}",
                                  f"it takes: {', '.join(sorted(action.fields))}")
        if action.prepare is not None:
            values = {k: v for k, v in action.prepare(values, self).items() if v is not None}
        tool = get_tool(action.tool)
        try:  # the page shows whole results: nothing cut to a reply's size
            request = tool.request.model_validate({**everything(tool.request), **values})
        except ValidationError as exc:
            raise ModuleLensError(f"invalid {action_name} request: {_describe(exc)}", "check the form's values")
        data = request.model_dump(mode="json", exclude_unset=True)
        subject = action.subject(data)
        job = Job(id=uuid.uuid4().hex[:12], action=action.name, tool=tool.name,
                  label=action.label.format(subject=subject), subject=subject, request=data,
                  started_at=time.time())
        spec = JobSpec(tool=tool.name, request=data, repo_root=str(self.repo_root))
        proc = subprocess.Popen(
            [sys.executable, "-m", "modulelens.ui.jobrun"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=self.project_root, env=_child_env(), text=True, errors="replace",
            start_new_session=True,
        )
        running = _Running(proc)
        with self._lock:
            self._jobs[job.id] = job
            self._running[job.id] = running
            self._forget_old()
        assert proc.stdin is not None
        proc.stdin.write(spec.model_dump_json())
        proc.stdin.close()
        threading.Thread(target=self._pump_log, args=(job.id, running), daemon=True).start()
        threading.Thread(target=self._follow, args=(job.id, running), daemon=True).start()
        return job.model_copy(deep=True)

    def _forget_old(self) -> None:
        finished = [k for k, j in self._jobs.items() if j.state != "running"]
        for k in finished[: max(0, len(self._jobs) - self.keep)]:
            del self._jobs[k]

    # -- following ----------------------------------------------------------------------------
    def _pump_log(self, job_id: str, running: _Running) -> None:
        assert running.proc.stderr is not None
        for line in running.proc.stderr:
            running.log.append(line.rstrip("\n")[-500:])
            with self._lock:
                if job_id in self._jobs:
                    self._jobs[job_id].log_tail = list(running.log)

    def _follow(self, job_id: str, running: _Running) -> None:
        assert running.proc.stdout is not None
        final: JobEvent | None = None
        for line in running.proc.stdout:
            try:
                event = JobEvent.model_validate_json(line)
            except ValidationError:
                continue
            if event.kind == "progress":
                with self._lock:
                    job = self._jobs.get(job_id)
                    if job is not None:
                        job.progress = (min(1.0, max(0.0, event.done / event.total))
                                        if event.total and event.done is not None else job.progress)
                        job.message = event.message or job.message
            else:
                final = event
        code = running.proc.wait()
        with self._lock:
            job = self._jobs.get(job_id)
            self._running.pop(job_id, None)
            if job is None:
                return
            job.ended_at = time.time()
            job.log_tail = list(running.log)
            if running.stop_requested:
                job.state, job.message = "stopped", "stopped from the UI"
            elif final is not None and final.kind == "result":
                job.state, job.result, job.progress, job.message = "done", final.result, 1.0, "done"
            elif final is not None:
                job.state, job.error, job.hint = "failed", final.error, final.hint
            else:
                job.state, job.error = "failed", f"the job's process ended (exit code {code}) without a result"

    # -- stopping -----------------------------------------------------------------------------
    def stop(self, job_id: str) -> Job:
        """Ask a running job to stop (SIGTERM to its process group, SIGKILL after a grace period)."""
        with self._lock:
            running = self._running.get(job_id)
        if running is not None:
            running.stop_requested = True
            _signal_group(running.proc, signal.SIGTERM)
            threading.Timer(STOP_GRACE_S, _signal_group, (running.proc, signal.SIGKILL)).start()
        return self.get(job_id)

    def close(self) -> None:
        """Stop every running job and wait for them (server shutdown)."""
        with self._lock:
            ids = list(self._running)
        for job_id in ids:
            self.stop(job_id)
        deadline = time.time() + STOP_GRACE_S + 1
        for job_id in ids:
            running = self._running.get(job_id)
            if running is not None:
                try:
                    running.proc.wait(max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    _signal_group(running.proc, signal.SIGKILL)


def _signal_group(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _child_env() -> dict[str, str]:
    """The server's environment, with this modulelens first on the path (the child must run the
    same code as the server, even when it was imported from a checkout)."""
    import modulelens

    here = str(Path(modulelens.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": here + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}
