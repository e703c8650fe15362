"""The sandbox worker process: ``python -m modulelens.sandbox.worker RUNNER TASK_FD RESULT_FD MEMORY_MB``.

``RUNNER`` is the ``package.module:NAME`` of the :class:`~modulelens.sandbox.worker_messages.TaskRunner`
that does the tasks, named by the pool's caller (:class:`~modulelens.sandbox.worker_messages.WorkerKind`)
and only ever inside modulelens. Its own stdout and stderr are files chosen by the parent, so
anything printed lands there, never in a protocol.

The worker is a **template** (:mod:`modulelens.sandbox.forkserver`): it imports torch, the runner
and, whenever it is idle, the modules the runner preloads (the candidate harness among them), and
never runs a task itself. For each task it forks a *checker*: the fork reads the task from TASK_FD, confines itself
(the runner does that first: it knows which files the task needs) and runs it, writing its stage
reports and result to a pipe that the worker relays to RESULT_FD frame by frame. While the checker
runs, the worker serves its requests for candidate processes (forks of the worker, so of the same
template, made before any task data existed here). When the checker dies without a result (a
``SIGBUS``, a segfault in a library), the worker answers for it with a
:class:`~modulelens.sandbox.worker_messages.CrashedResult` and carries on with the next task: its
own state was never touched. Candidate processes a checker left behind are killed when it ends.

Where the worker cannot fork (not Linux, or a thread was started here), it runs one task itself
and exits, so that the pool starts a fresh worker for the next (a task confines the process that
runs it for good).
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import resource
import select
import socket
import struct
import sys
import traceback
from typing import Any

NO_TASK = 3  # a checker's exit code when the task pipe closed: the worker's caller is done


def _limit_memory(megabytes: int) -> None:
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def load_runner(path: str) -> Any:
    """The object ``path`` (``package.module:NAME``, a module inside modulelens) names."""
    module, _, name = path.partition(":")
    if not (module.startswith("modulelens.") and name.isidentifier()):
        raise ValueError(f"a task runner must be modulelens.<module>:<NAME>, not {path!r}")
    return getattr(importlib.import_module(module), name)


def _answer(runner: Any, task_fd: int, out: int, last: bool = False) -> int:
    """Read one task and write its stage reports and result to ``out``. Returns NO_TASK at EOF.
    ``last``: this process ends after it (the result says it is not to be reused)."""
    from modulelens.sandbox import protocol
    from modulelens.sandbox.worker_messages import InternalErrorResult, StageReport

    def stage(name: str) -> None:
        protocol.send(out, StageReport(stage=name))

    try:
        task = protocol.receive(task_fd, runner.tasks)
        if task is None:
            return NO_TASK
        result = runner.run(task, stage)
    except BaseException as e:  # noqa: BLE001 - the parent must always get an answer
        result = InternalErrorResult(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
    if last:
        result.healthy = False
    protocol.send(out, result)
    return 0


def _checker(runner: Any, task_fd: int, relay: int, fork_sock: int) -> None:
    """The forked checker: one task, then exit. Never returns."""
    from modulelens.sandbox import forkserver

    code = 70
    try:
        forkserver.die_with_parent()
        forkserver.use_inherited(fork_sock)
        code = _answer(runner, task_fd, relay)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        forkserver.exit_now(code)


def _read_frame(fd: int) -> bytes | None:
    header = b""
    while len(header) < 4:
        chunk = os.read(fd, 4 - len(header))
        if not chunk:
            return None
        header += chunk
    (size,) = struct.unpack("!I", header)
    body = b""
    while len(body) < size:
        chunk = os.read(fd, size - len(body))
        if not chunk:
            return None
        body += chunk
    return header + body


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _exit_reason(status: int) -> str:
    from modulelens.workers import how_it_ended

    code = os.waitstatus_to_exitcode(status)
    return how_it_ended(code) + (" without a result" if code >= 0 else "")


def _one_task(runner: Any, task_fd: int, result_fd: int, service: Any, pending: list) -> bool:
    """Fork a checker for the next task, relay its frames, serve its candidate processes, and do
    the template's idle work (``pending``: :func:`~modulelens.sandbox.forkserver.idle_steps`)
    while nothing asks for anything. Returns False when there are no more tasks."""
    from modulelens.sandbox import forkserver, protocol
    from modulelens.sandbox.worker_messages import CrashedResult

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    relay_r, relay_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        ours.close()
        os.close(relay_r)
        os.close(result_fd)
        _checker(runner, task_fd, relay_w, theirs.detach())
    theirs.close()
    os.close(relay_w)
    fork_sock = ours.detach()
    answered, open_fds = False, [relay_r, fork_sock]
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [], forkserver.IDLE_POLL_S if pending else 0.5)
        service.reap()
        if not ready and pending:
            forkserver.run_idle_step(pending)
        for fd in ready:
            if fd not in open_fds:
                continue
            if fd == fork_sock:
                if not service.handle(fork_sock):
                    open_fds.remove(fork_sock)
                continue
            frame = _read_frame(relay_r)
            if frame is None:  # the checker is done (or dead): nothing more to serve it
                open_fds.clear()
                continue
            _write_all(result_fd, frame)
            answered = answered or json.loads(frame[4:]).get("kind") != "stage"
    _, status = os.waitpid(pid, 0)
    for fd in (relay_r, fork_sock):
        os.close(fd)
    service.kill_all()  # candidate processes its checker left behind
    if os.waitstatus_to_exitcode(status) == NO_TASK and not answered:
        return False
    if not answered:
        protocol.send(result_fd, CrashedResult(reason=f"checker process {_exit_reason(status)}", healthy=True))
    return True


def main(argv: list[str]) -> int:
    runner_path, task_fd, result_fd, memory_mb = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    import torch  # noqa: F401  (import before the limit: the limit is for what candidates allocate)

    from modulelens.sandbox import forkserver

    if not forkserver.cuda_present():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton kernels are defined
        _limit_memory(memory_mb)  # address-space limits break CUDA; GPU runs rely on the device's memory
    runner = load_runner(runner_path)
    if platform.system() != "Linux" or forkserver.thread_count() != 1:
        _answer(runner, task_fd, result_fd, last=True)  # no forking: one task here, then a fresh worker
        return 0
    service = forkserver.ForkService()
    # idle work: import what forks will need and warm what they share, off the path of a task that
    # is already waiting (a command's first task arrives as the worker gets ready: its forks import
    # what they use, and the work goes on between that task's requests)
    pending = forkserver.idle_steps(list(runner.preload))
    while True:
        if not select.select([task_fd], [], [], 0 if pending else None)[0]:
            forkserver.run_idle_step(pending)
            continue
        if forkserver.thread_count() != 1:  # something started a thread: no more forks from here
            _answer(runner, task_fd, result_fd, last=True)
            return 0
        if not _one_task(runner, task_fd, result_fd, service, pending):
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
