"""Start, reuse and replace sandbox workers.

What a worker runs is its :class:`~modulelens.sandbox.worker_messages.WorkerKind`, chosen by the
pool's caller: the task runner it imports and the frames it answers with. Each worker is
``python -m modulelens.sandbox.worker RUNNER ...`` in a scratch folder (also its HOME and
TMPDIR), with an environment reduced to an allow-list (no API keys or tokens, and no
``MODULELENS_CONFIG_DIR``: nothing in a worker needs the signing key; trust is checked by the
caller before a task is sent), its stdout and
stderr going to files in the scratch folder, a memory limit it sets on itself, and tasks and
results passing over two dedicated pipes. A task that outlives its timeout kills the worker; a
worker that crashed, was killed, or reports itself unhealthy is replaced by a fresh one. A task
whose call is cancelled (:mod:`modulelens.cancellation`) kills the worker's process group (its
candidate processes die with it) and raises :class:`~modulelens.cancellation.CallCancelled`.
A worker is a fork-server template (:mod:`modulelens.sandbox.worker`): one whose environment
changed since it started (torch upgraded, modulelens's files edited:
:func:`~modulelens.sandbox.forkserver.environment_key`) is replaced before its next task.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from modulelens.cancellation import CallCancelled, cancel_requested
from modulelens.sandbox import protocol
from modulelens.sandbox.forkserver import environment_key
from modulelens.sandbox.worker_messages import CrashedResult, StageReport, WorkerKind, WorkerResult
from modulelens.workers import how_it_ended, module_command

_ALLOW = re.compile(
    r"^(PATH|LANG|LC_\w+|TZ|TERM|CUDA_\w+|NVIDIA_\w+|LD_LIBRARY_PATH|OMP_\w+|MKL_\w+|OPENBLAS_\w+|KMP_\w+|"
    r"TORCH_\w+|TRITON_\w+|CC|CXX|NVCC_\w+|VIRTUAL_ENV|PYTHONPATH|CONDA_PREFIX|MAX_JOBS|MODULELENS_BUILD_DIR|"
    r"XDG_CACHE_HOME|PYTORCH_\w+|MODULELENS_FORK_SERVER)$"
)
_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
DEFAULT_MEMORY_LIMIT_MB = 6144
POLL_S = 0.25  # how often a waiting caller checks for cancellation


def scrubbed_environment(scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if _ALLOW.match(k) and not _SECRET.search(k)}
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    env.update(HOME=str(scratch), TMPDIR=str(scratch / "tmp"), XDG_CACHE_HOME=cache, PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1")
    return env


def template_environment(scratch: Path) -> dict[str, str]:
    """The scrubbed environment of a process that forks others (a worker, a template): OpenBLAS (numpy's
    BLAS) is told to use one thread, because it starts its thread pool when it is loaded, and a fork
    server must have no thread when it forks (see :mod:`modulelens.sandbox.forkserver`)."""
    return {**scrubbed_environment(scratch), "OPENBLAS_NUM_THREADS": "1", "GOTO_NUM_THREADS": "1"}


class WorkerCrashed(Exception):
    def __init__(self, reason: str, stage: str | None, stderr_tail: str):
        super().__init__(reason)
        self.reason, self.stage, self.stderr_tail = reason, stage, stderr_tail


class SandboxWorker:
    """One worker process running the task runner ``runner`` (``package.module:NAME``), whose
    answers are read as ``replies`` (may be set later: a worker started before its caller imported
    what its replies are, see :func:`prestart`)."""

    def __init__(self, runner: str, memory_limit_mb: int, replies: Any = None):
        self.runner, self.replies = runner, replies
        self.memory_limit_mb = memory_limit_mb
        self.scratch = Path(tempfile.mkdtemp(prefix="modulelens-sandbox-"))
        (self.scratch / "tmp").mkdir()
        self.stdout_path = self.scratch / "stdout.log"
        self.stderr_path = self.scratch / "stderr.log"
        task_r, self._task_w = os.pipe()
        self._result_r, result_w = os.pipe()
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                module_command("modulelens.sandbox.worker", [runner, str(task_r), str(result_w), str(memory_limit_mb)]),
                pass_fds=(task_r, result_w), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                cwd=self.scratch, env=template_environment(self.scratch), start_new_session=True,
            )
        os.close(task_r)
        os.close(result_w)
        self.tasks = 0
        self.environment = environment_key()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, n: int = 1500) -> str:
        try:
            return self.stderr_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stdout_size(self) -> int:
        try:
            return self.stdout_path.stat().st_size
        except OSError:
            return 0

    def run(self, task: BaseModel, timeout: float, on_stage: Callable[[str], None] | None = None) -> WorkerResult:
        """Send a task and wait for its result. Raises WorkerCrashed on a crash or timeout, and
        CallCancelled (after killing the worker) when the call is cancelled."""
        self.tasks += 1
        stage = "starting"
        try:
            protocol.send(self._task_w, task)
        except (BrokenPipeError, OSError):
            raise WorkerCrashed(self._death_reason(), stage, self.stderr_tail()) from None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerCrashed(f"timed out after {timeout:.0f} s", stage, self.stderr_tail())
            ready, _, _ = select.select([self._result_r], [], [], min(remaining, POLL_S))
            if not ready:
                if cancel_requested():
                    self.kill()
                    raise CallCancelled(f"the sandbox worker (during {stage})")
                continue
            message = protocol.receive(self._result_r, self.replies)
            if message is None:
                self.proc.wait(timeout=10)
                raise WorkerCrashed(self._death_reason(), stage, self.stderr_tail())
            if isinstance(message, StageReport):
                stage = message.stage
                if on_stage:
                    on_stage(stage)
                continue
            if isinstance(message, CrashedResult) and message.stage is None:
                message.stage = stage  # the worker's checker died: the worker cannot know where
            return message

    def _death_reason(self) -> str:
        code = self.proc.poll()
        if code is None:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                return "stopped answering"
        return how_it_ended(code)

    def kill(self) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        for fd in (self._task_w, self._result_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.scratch, ignore_errors=True)


class SandboxPool:
    """One reusable worker of ``kind`` at a time, behind a lock (tasks queue up)."""

    MAX_TASKS_PER_WORKER = 50

    def __init__(self, kind: WorkerKind, memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB):
        self.kind = kind
        self.memory_limit_mb = memory_limit_mb
        self._worker: SandboxWorker | None = None
        self._lock = threading.Lock()
        self.started = 0

    def _get(self, memory_limit_mb: int) -> SandboxWorker:
        w = self._worker
        if w is not None and (not w.alive() or w.memory_limit_mb != memory_limit_mb or w.tasks >= self.MAX_TASKS_PER_WORKER
                              or w.environment != environment_key()):
            w.close()
            w = None
        if w is None:
            w = _adopt_prestarted(self.kind.runner, memory_limit_mb) or SandboxWorker(self.kind.runner, memory_limit_mb)
            w.replies = self.kind.replies
            self._worker = w
            self.started += 1
        return w

    def run(self, task: BaseModel, timeout: float, memory_limit_mb: int | None = None,
            on_stage: Callable[[str], None] | None = None) -> WorkerResult:
        """Run a task. Returns the worker's result; a crash or timeout becomes a :class:`CrashedResult`."""
        with self._lock:
            worker = self._get(memory_limit_mb or self.memory_limit_mb)
            before = worker.stdout_size()
            try:
                result = worker.run(task, timeout, on_stage)
            except WorkerCrashed as e:
                worker.close()
                self._worker = None
                return CrashedResult(reason=e.reason, stage=e.stage, stderr_tail=e.stderr_tail)
            except BaseException:  # cancelled or interrupted: the worker is in an unknown state
                worker.close()
                self._worker = None
                raise
            wrote = worker.stdout_size() - before
            result.stdout_bytes = wrote
            if wrote or not result.healthy:
                worker.close()  # a worker whose state a candidate touched is not reused
                self._worker = None
            return result

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None


_POOLS: dict[str, SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(kind: WorkerKind) -> SandboxPool:
    """The process's shared pool of ``kind`` workers (one per task runner), closed at exit."""
    with _POOLS_LOCK:
        found = _POOLS.get(kind.runner)
        if found is None:
            found = _POOLS[kind.runner] = SandboxPool(kind)
            atexit.register(found.close)
        return found


_PRESTARTED: list[SandboxWorker] = []


def prestart(runner: str, memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB) -> None:
    """Start a worker for ``runner`` now, before the caller has imported what it will need (a CLI
    command that will validate: its worker imports torch while the command imports the rest). The
    first pool of that runner and memory limit adopts it; one never adopted is killed at exit."""
    worker = SandboxWorker(runner, memory_limit_mb)
    _PRESTARTED.append(worker)
    atexit.register(worker.close)


def _adopt_prestarted(runner: str, memory_limit_mb: int) -> SandboxWorker | None:
    for worker in list(_PRESTARTED):
        if worker.runner == runner and worker.memory_limit_mb == memory_limit_mb:
            _PRESTARTED.remove(worker)
            if worker.alive() and worker.environment == environment_key():
                return worker
            worker.close()
    return None
