"""The jobs of one repository: records under ``<repo>/.jobs``, started, read, waited on and
cancelled the same way by every front end (see :mod:`modulelens.jobs`)."""

from __future__ import annotations

import datetime as _dt
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from modulelens.errors import ReferenceNotFound
from modulelens.repo import default_repo_root, owner_alive, this_process
from modulelens.workers import module_command

JOBS_DIR = ".jobs"
CANCEL_WAIT_S = 30.0  # how long a cancelled job's tool has to stop its workers before it is killed
KEEP_FINISHED_S = 7 * 24 * 3600.0  # a finished job's files are removed by a later start after this
POLL_S = 0.25
LOG_TAIL_BYTES = 16_384
JOB_PROCESS = "modulelens.jobs.process"
# The tools that may outlast a client's request timeout: MCP offers the job tools for these, and the
# CLI shows its own calls of them as jobs (see :meth:`JobTable.attach`).
LONG_TOOLS = ("capture_module", "gather_stats", "validate_kernel", "generate_kernel",
              "optimize", "capture_ops", "profile", "export_repro", "replay_module", "run")
# The request field that says what a job acts on, for the UI's job table (the first one given).
SUBJECT_FIELDS = ("ref", "candidate", "capture", "script", "card", "search_id", "targets", "target", "pack", "source")
_JOB_ID = re.compile(r"^[a-z0-9_]+-[0-9a-f]{8}$")

JobState = Literal["running", "done", "failed", "cancelled"]


class JobRecord(BaseModel):
    """One job (``<repo>/.jobs/<id>.json``): written once by whoever starts it, then only by the
    job process (its owner, progress and, at the end, its result or error)."""

    job: str = Field(description="Job id: the tool's name and 8 hex digits.")
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's request, validated.")
    label: str = Field("", description="What the job does, for people.")
    subject: str = Field("", description="What it acts on (a reference, a script).")
    action: str | None = Field(None, description="The UI action that started it; None when started otherwise.")
    state: JobState
    started_at: str = Field(description="ISO time the job started.")
    ended_at: str | None = None
    progress: float | None = None
    total: float | None = None
    message: str | None = Field(None, description="The tool's last progress message.")
    result: dict[str, Any] | None = Field(None, description="The tool's result (JSON, markers written as arguments).")
    error: str | None = Field(None, description="Why it failed or was cancelled (raw: with argument markers).")
    hint: str | None = None
    error_type: str | None = Field(None, description="The error's kind (its exception type, or 'internal error').")
    owner: str = Field("", description="The job process (pid.start), once it runs.")

    def elapsed_s(self) -> float:
        end = _dt.datetime.fromisoformat(self.ended_at) if self.ended_at else _dt.datetime.now(_dt.UTC)
        return round((end - _dt.datetime.fromisoformat(self.started_at)).total_seconds(), 1)


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def write_record(path: Path, record: JobRecord) -> None:
    """Write ``record`` to ``path`` atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(record.model_dump_json())
    os.replace(tmp, path)


def job_subject(arguments: dict[str, Any]) -> str:
    """What a call with ``arguments`` acts on (the first of ``SUBJECT_FIELDS`` given), for people."""
    for name in SUBJECT_FIELDS:
        value = arguments.get(name)
        if value:
            return ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    return ""


def cancel_marker(record_path: Path) -> Path:
    """The file whose presence asks the job of ``record_path`` to stop."""
    return record_path.with_suffix(".cancel")


class JobTable:
    """The jobs of one repository (``<repo>/.jobs``); ``None`` is the default repository."""

    def __init__(self, repo_root: Path | None):
        self._repo_root = repo_root

    @property
    def folder(self) -> Path:
        root = self._repo_root if self._repo_root is not None else default_repo_root()
        return Path(root).absolute() / JOBS_DIR

    # -- starting -----------------------------------------------------------------------------
    def start(self, tool: str, arguments: dict[str, Any], *, label: str = "", subject: str = "",
              action: str | None = None, cwd: Path | None = None) -> JobRecord:
        """Start ``tool`` on ``arguments`` (already validated against its request) in a detached job
        process (its own session, running in ``cwd``), and return its first record."""
        path, record = self._new(tool, arguments, label=label, subject=subject, action=action)
        with open(path.with_suffix(".log"), "ab") as log:
            proc = subprocess.Popen(module_command(JOB_PROCESS, [str(path)]), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log, cwd=cwd, env=job_environment(), start_new_session=True)
        threading.Thread(target=_reap, args=(proc, path), daemon=True).start()
        return record

    def attach(self, tool: str, arguments: dict[str, Any]) -> Path:
        """Record a call this process runs itself (the CLI's) as a running job that it owns, and
        return the record's path: it is read, waited on and stopped like any job (a stop is a
        SIGTERM to this process, see :func:`modulelens.jobs.process.attached_job`)."""
        subject = job_subject(arguments)
        path, _ = self._new(tool, arguments, label=f"{tool} {subject}".strip(), subject=subject, action=None,
                            owner=this_process())
        return path

    def _new(self, tool: str, arguments: dict[str, Any], *, label: str, subject: str, action: str | None,
             owner: str = "") -> tuple[Path, JobRecord]:
        folder = self.folder
        folder.mkdir(parents=True, exist_ok=True)
        self._forget_old(folder)
        record = JobRecord(job=f"{tool}-{secrets.token_hex(4)}", tool=tool, arguments=arguments,
                           label=label or tool, subject=subject, action=action, state="running",
                           started_at=now_iso(), message="starting", owner=owner)
        path = folder / f"{record.job}.json"
        write_record(path, record)
        return path, record

    # -- reading ------------------------------------------------------------------------------
    def get(self, job_id: str) -> JobRecord:
        """The job's record; a running job whose process is gone ends here as ``failed`` (or
        ``cancelled`` when it was asked to stop)."""
        path = self.folder / f"{job_id}.json"
        if not _JOB_ID.match(job_id) or not path.is_file():
            known = [r.job for r in self.jobs(limit=10)]
            raise ReferenceNotFound(f"no job {job_id!r}", f"jobs: {', '.join(known)}" if known
                                    else "start one with start_job (or from the UI)")
        return _settled(path)

    def jobs(self, limit: int = 100) -> list[JobRecord]:
        """The newest ``limit`` jobs, newest first (records that cannot be read are skipped)."""
        found = []
        for path in self.folder.glob("*.json") if self.folder.is_dir() else ():
            if _JOB_ID.match(path.stem):
                try:
                    found.append(_settled(path))
                except (OSError, ValueError):
                    continue
        return sorted(found, key=lambda r: r.started_at, reverse=True)[:limit]

    def wait(self, job_id: str, seconds: float) -> JobRecord:
        """The job's record once it ended, or after ``seconds``."""
        deadline = time.monotonic() + seconds
        record = self.get(job_id)
        while record.state == "running" and time.monotonic() < deadline:
            time.sleep(POLL_S)
            record = self.get(job_id)
        return record

    def log_tail(self, job_id: str, lines: int) -> list[str]:
        """The last ``lines`` lines the job process printed (each cut to 500 characters)."""
        try:
            with open(self.folder / f"{job_id}.log", "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [line[-500:] for line in text.splitlines()[-lines:]]

    # -- cancelling ---------------------------------------------------------------------------
    def cancel(self, job_id: str) -> JobRecord:
        """Stop the job and wait for it to end: the job process is asked to cancel its call
        (SIGTERM; its waiting code kills the workers, and the tool leaves the repository
        consistent), and kills its own process group when the tool has not stopped within
        ``CANCEL_WAIT_S``; a job process that cannot even do that is killed from here."""
        record = self.get(job_id)
        if record.state != "running":
            return record
        path = self.folder / f"{job_id}.json"
        cancel_marker(path).touch()  # before reading the owner: a job process not yet running sees it
        record = _settled(path)
        if record.owner and owner_alive(record.owner):
            _signal(int(record.owner.partition(".")[0]), signal.SIGTERM)
        record = self.wait(job_id, CANCEL_WAIT_S + 5.0)
        if record.state == "running" and record.owner and owner_alive(record.owner):
            _signal(int(record.owner.partition(".")[0]), signal.SIGKILL, group=True)
            record = self.wait(job_id, 5.0)
        return record

    @staticmethod
    def _forget_old(folder: Path) -> None:
        """Remove the files of jobs that ended more than ``KEEP_FINISHED_S`` ago."""
        now = time.time()
        for path in folder.glob("*.json"):
            if not _JOB_ID.match(path.stem):
                continue
            try:
                if now - path.stat().st_mtime > KEEP_FINISHED_S and _settled(path).state != "running":
                    for suffix in (".json", ".log", ".cancel", ".request.json"):  # .request.json: older jobs
                        path.with_name(path.stem + suffix).unlink(missing_ok=True)
            except (OSError, ValueError):
                continue


def _settled(path: Path) -> JobRecord:
    """The record at ``path``, ended when it says running but its job process is gone."""
    record = JobRecord.model_validate_json(path.read_text())
    if record.state != "running" or not record.owner or owner_alive(record.owner):
        return record
    record = JobRecord.model_validate_json(path.read_text())  # it may have just ended
    if record.state == "running":
        stopped = cancel_marker(path).exists()
        record.state = "cancelled" if stopped else "failed"
        record.ended_at = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.UTC).isoformat(timespec="milliseconds")
        record.error_type = "internal error"
        record.error = ("the job process was killed after it was asked to stop" if stopped
                        else "the job process ended without a result (killed?)")
    return record


def _reap(proc: subprocess.Popen[bytes], path: Path) -> None:
    """Wait for the job process; one that died before it took its record over fails the job."""
    code = proc.wait()
    try:
        record = JobRecord.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return
    if record.state == "running" and not record.owner:
        write_record(path, record.model_copy(update={
            "state": "failed", "ended_at": now_iso(), "error_type": "internal error",
            "error": f"the job process ended (exit code {code}) before it started the tool",
            "hint": f"see its log, {path.with_suffix('.log')}"}))


def _signal(pid: int, sig: signal.Signals, *, group: bool = False) -> None:
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def job_environment() -> dict[str, str]:
    """This process's environment, with this modulelens first on the path (the job process must
    run the same code as its starter, even when that was imported from a checkout)."""
    here = str(Path(__file__).resolve().parents[2])  # the folder that holds the modulelens package
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": here + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}
