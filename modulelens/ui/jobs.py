"""Actions the UI can start (replay a capture, validate a candidate, gather statistics, continue a
search), each run as a job of the repository (:mod:`modulelens.jobs`, the runtime the MCP server's
``start_job`` uses too): one tool from the registry, called in a process of its own so that it can
be stopped at any time, with its progress and result kept for the page to poll. The Jobs page
lists every job of the repository, those an agent started over MCP included, and stops any of them.

Only the actions in :data:`ACTIONS` can be started, each with a fixed set of request fields: the
web layer cannot reach a tool that writes outside the repository (install_skills) or runs an
arbitrary file. A script for gather_stats must be a ``.py`` file inside the project folder (where
the server was started). ``continue_search`` runs optimize again on a stored search: its targets,
provider, backend and settings as stored, with ``more`` evaluations beyond the nodes it has.

A job the UI started is stopped when the UI's server shuts down; the others are left running.
"""

from __future__ import annotations

import datetime as _dt
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from modulelens.arguments import argument_errors
from modulelens.errors import Front, ModuleLensError, ReferenceNotFound
from modulelens.jobs import CANCEL_WAIT_S, JobRecord, JobTable
from modulelens.jobs.table import job_subject
from modulelens.listing import MAX_ITEMS, everything
from modulelens.paths import refuse_outside_outputs
from modulelens.tools import get_tool
from modulelens.ui.outcomes import job_outcome

LOG_LINES = 40
UI_FRONT: Front = "args"
"""How argument markers in errors read in the UI: as argument names, which are the names of the
pages' form fields (``strategy``, ``script_args``, ``every``)."""

JobStateName = Literal["running", "done", "failed", "stopped"]


class Job(BaseModel):
    """A job as the pages read it (``/api/jobs``)."""

    id: str
    action: str | None = Field(None, description="The UI action that started it; None when an agent did.")
    tool: str
    label: str = Field(description="What the job does, for people.")
    subject: str = Field(description="What it acts on (a capture or candidate reference, a script).")
    request: dict[str, Any]
    state: JobStateName = "running"
    started_at: float = Field(description="Unix time.")
    ended_at: float | None = None
    progress: float | None = Field(None, description="0..1 when the tool reports a total.")
    progress_text: str = Field("", description="While running: the percentage done, or 'running, N s' when the "
                               "tool reports no total.")
    message: str = ""
    result: dict[str, Any] | None = None
    outcome: str | None = Field(None, description="Once done: what it came to, in words (verdict, match, what was stored).")
    good: bool | None = Field(None, description="Once done: whether the outcome is a good one.")
    link: str | None = Field(None, description="Once done: the page of what it made or checked.")
    error: str | None = None
    hint: str | None = None
    log_tail: list[str] = Field(default_factory=list, description="Last lines the job printed.")


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
    prepare: Callable[[dict[str, Any], UiJobs], dict[str, Any]] | None = None


def _script_inside(params: dict[str, Any], jobs: UiJobs) -> dict[str, Any]:
    """gather_stats: a script given must be a .py file inside the project; its arguments may come
    as one string (split like a shell would)."""
    project = jobs.project_root
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


def _continue_search(params: dict[str, Any], jobs: UiJobs) -> dict[str, Any]:
    """optimize's request that resumes the stored search ``search_id`` (see the module docstring)."""
    from modulelens.registry import ToolContext

    show = get_tool("show")
    summary = show(show.request.model_validate({**everything(show.request), "kind": "searches",
                                                "ref": params["search_id"]}), ToolContext(repo_root=jobs.repo_root))
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


def job_view(record: JobRecord, log_tail: list[str]) -> Job:
    """``record`` as the pages read it: a cancelled job reads ``stopped``, progress as a fraction
    (or, with no total reported, an honest "running, N s"), times as Unix times, errors with
    arguments named as the forms' fields; a job started elsewhere (an agent's ``start_job``, the
    CLI) named by its tool and main argument, and once done, its outcome and its result's page."""
    error, hint = (ModuleLensError(record.error, record.hint).rendered(UI_FRONT) if record.error is not None
                   else (None, None))
    state = "stopped" if record.state == "cancelled" else record.state
    progress = (min(1.0, max(0.0, record.progress / record.total))
                if record.total and record.progress is not None else None)
    message = {"done": "done", "stopped": "stopped"}.get(state, record.message or "")
    subject = record.subject or job_subject(record.arguments)
    label = record.label if record.label not in ("", record.tool) else f"{record.tool} {subject}".strip()
    progress_text = ("" if state != "running" else f"running, {record.elapsed_s():.0f} s" if progress is None
                     else f"{progress:.0%}, {record.elapsed_s():.0f} s")
    outcome = job_outcome(record.tool, record.result) if state == "done" else None
    return Job(id=record.job, action=record.action, tool=record.tool, label=label,
               subject=subject, request=record.arguments, state=state, started_at=_unix(record.started_at),
               ended_at=_unix(record.ended_at) if record.ended_at else None,
               progress=1.0 if state == "done" else progress, progress_text=progress_text, message=message,
               result=record.result, outcome=outcome.text if outcome else None, good=outcome.good if outcome else None,
               link=outcome.link if outcome else None, error=error, hint=hint, log_tail=log_tail)


def _unix(iso: str) -> float:
    return _dt.datetime.fromisoformat(iso).timestamp()


class UiJobs:
    """The UI's side of the repository's jobs: starts actions, reads and stops any job."""

    def __init__(self, repo_root: Path, project_root: Path):
        self.repo_root = repo_root
        self.project_root = project_root
        self.table = JobTable(repo_root)
        self._started: set[str] = set()
        self._lock = threading.Lock()

    # -- reading ------------------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        """The repository's newest jobs, newest first."""
        return [job_view(r, self.table.log_tail(r.job, LOG_LINES)) for r in self.table.jobs(limit=MAX_ITEMS)]

    def get(self, job_id: str) -> Job:
        return job_view(self.table.get(job_id), self.table.log_tail(job_id, LOG_LINES))

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
        refuse_outside_outputs(data, self.project_root, self.repo_root)  # a page's form is not a person's shell
        subject = action.subject(data)
        record = self.table.start(tool.name, data, label=action.label.format(subject=subject), subject=subject,
                                  action=action.name, cwd=self.project_root)
        with self._lock:
            self._started.add(record.job)
        return job_view(record, [])

    # -- stopping -----------------------------------------------------------------------------
    def stop(self, job_id: str) -> Job:
        """Ask a running job to stop (see :meth:`JobTable.cancel`), without waiting for it."""
        job = self.get(job_id)
        if job.state == "running":
            threading.Thread(target=self.table.cancel, args=(job_id,), daemon=True).start()
        return job

    def close(self) -> None:
        """Stop the running jobs this UI started and wait for them (server shutdown)."""
        with self._lock:
            started = set(self._started)
        ids = [r.job for r in self.table.jobs(limit=MAX_ITEMS) if r.job in started and r.state == "running"]
        stopping = [threading.Thread(target=self.table.cancel, args=(i,), daemon=True) for i in ids]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join(CANCEL_WAIT_S + 10.0)
