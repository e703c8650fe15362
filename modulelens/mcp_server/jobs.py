"""Start-then-poll for calls that outlast a client's request timeout.

MCP clients give up on a request after a fixed time (the MCP Inspector after 60 s, and it starts
a new server for every command), and a cold C++ build, a capture or a statistics run can take
longer. The SDK's server has no task support such clients can drive, so the server offers two
tools of its own over the repository's jobs (:mod:`modulelens.jobs`, shared with the web UI):

* ``start_job(tool, arguments)`` validates the arguments as ``tool`` would, starts the call as a
  job and answers at once with the job's id;
* ``job_status(job, wait)`` says how the job stands (state, last progress message, seconds
  elapsed), waiting up to ``wait`` seconds for it to finish; a finished job carries the tool's
  result (``result``, as the tool returns it) or its error text;
* ``job_status(job, cancel=true)`` stops the job first: its worker processes are killed as for a
  cancelled call (see :mod:`modulelens.cancellation`), and it ends ``cancelled``.

A job outlives the server that started it, and any server (or the UI) on the same repository can
report on it or cancel it; jobs started from the UI are read and stopped here the same way.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationError

from modulelens.arguments import loose_booleans, parse_json_text, unknown_names
from modulelens.errors import ModuleLensError
from modulelens.jobs import JobRecord, JobState, JobTable
from modulelens.jobs.table import LONG_TOOLS, job_subject
from modulelens.mcp_server.calls import error_text, validation_text
from modulelens.paths import refuse_outside_outputs
from modulelens.registry import Tool, ToolContext, ToolRegistry, tool
from modulelens.replies import NextCall, ToolReply, call

MAX_WAIT_S = 50.0  # below the common 60 s client request timeout


class JobStatus(ToolReply):
    """Where a background job stands."""

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


def job_status_of(record: JobRecord) -> JobStatus:
    """The job's record as ``start_job`` and ``job_status`` answer it, with its next call: poll a
    running job; once done, the warnings and next calls of its result, lifted to the top level
    where an agent reads them first (``result`` keeps them too); otherwise a warning saying why it
    ended."""
    error = (error_text(ModuleLensError(record.error, record.hint), kind=record.error_type)
             if record.error is not None else None)
    status = JobStatus(job=record.job, tool=record.tool, state=record.state, started_at=record.started_at,
                       elapsed_s=record.elapsed_s(), progress=record.progress, total=record.total,
                       message=record.message, result=record.result, error=error, owner=record.owner)
    if status.state == "running":
        status.next = [call("job_status", job=status.job, wait=MAX_WAIT_S)]
    elif status.state == "done" and status.result:
        status.warnings = [w for w in status.result.get("warnings", []) if isinstance(w, str)]
        status.next = [NextCall.model_validate(n) for n in status.result.get("next", [])]
    else:
        status.warnings = [f"the job {status.state}: {status.error or 'no reason recorded'}"]
    return status


class StartJobRequest(BaseModel):
    tool: str = Field(description="A long tool: " + ", ".join(LONG_TOOLS) + ".")
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
        unknown = unknown_names(chosen.request, arguments) or loose_booleans(chosen.request, arguments)
        if unknown is not None:
            raise ModuleLensError(f"invalid arguments for {chosen.name}: {unknown}", None)
        try:
            checked = chosen.request.model_validate(arguments)
        except ValidationError as exc:
            raise ModuleLensError(validation_text(exc), None) from None
        data = checked.model_dump(mode="json", exclude_unset=True)
        refuse_outside_outputs(checked.model_dump(), ctx.project, ctx.repo_root)  # before the job starts
        subject = job_subject(data)
        record = JobTable(ctx.repo_root).start(chosen.name, data, label=f"{chosen.name} {subject}".strip(),
                                               subject=subject)
        return job_status_of(record)

    @tool
    def job_status(request: JobStatusRequest, ctx: ToolContext) -> JobStatus:
        """How a background job stands (or stop it); once ended, its result or error."""
        table = JobTable(ctx.repo_root)
        try:
            record = table.cancel(request.job) if request.cancel else table.wait(request.job, request.wait)
        except (OSError, ValueError) as exc:
            raise ModuleLensError(f"cannot read job {request.job!r}: {exc}", None) from exc
        return job_status_of(record)

    return [start_job, job_status]
