"""The protocol between a tool and a worker process that runs user code (capture, statistics).

User code never runs in the tool's process: it gets its own ``sys.argv``, ``__main__`` and stdout
(an MCP server's stdout is its protocol stream), and it can crash or hang without harming the
caller. Both sides of the protocol live here:

* parent: write the request model as JSON (``model_dump_json``), start the worker with
  :func:`run_worker_process` (its output relayed to stderr, never stdout; a timeout), then read each
  result file with :func:`read_worker_result`;
* child: :func:`worker_main` reads the request (``model_validate_json``), runs, writes one result
  file and ends the process at once.

The worker runs in its own process group, which is killed whenever the parent stops waiting
(a timeout, a cancelled call — see :mod:`modulelens.cancellation` — or any exception such as
Ctrl-C). The other way round, the worker watches its caller (named in ``MODULELENS_CALLER``): when
the caller dies (``kill -9`` of the CLI or the MCP server) the worker kills its process group
within a second, and it never publishes an artifact once its caller is gone (the repository's
publish guard).

A result file holds either the worker's result (a :class:`WorkerResult` subclass, ``ok: true``)
or a :class:`WorkerFailure` (``ok: false``, the error's message and hint). The child always writes
one, unless the interpreter itself dies (segfault, out of memory): then there is no file.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from modulelens.cancellation import CallCancelled, cancel_requested
from modulelens.errors import ModuleLensError
from modulelens.repo.owners import owner_alive, this_process

OUTPUT_TAIL_LINES = 40
CALLER_ENV = "MODULELENS_CALLER"
POLL_S = 0.2  # how often the parent checks for cancellation, and the child for its caller

Req = TypeVar("Req", bound=BaseModel)
Res = TypeVar("Res", bound="WorkerResult")


class WorkerResult(BaseModel):
    """Base of a worker's result; each worker's subclass adds its fields."""

    ok: Literal[True] = True


class WorkerFailure(BaseModel):
    """What a worker writes instead of its result when it fails."""

    ok: Literal[False] = False
    error: str
    hint: str | None = None
    type: str = "ModuleLensError"

    def to_error(self) -> ModuleLensError:
        return ModuleLensError(self.error, self.hint)


class _Outcome(BaseModel):
    ok: bool


@dataclass(frozen=True)
class WorkerExit:
    """How a worker process ended: its exit code and the last lines it printed."""

    code: int
    output_tail: str


def run_worker_process(
    cmd: list[str], *, relay_to_stderr: bool, timeout: float, timeout_error: ModuleLensError
) -> WorkerExit:
    """Run a worker command to its end, its stdout and stderr relayed line by line to our stderr
    when ``relay_to_stderr`` (never to our stdout: with MCP over stdio, stdout is the protocol).

    Raises ``timeout_error`` after killing the worker when it runs longer than ``timeout`` seconds,
    and :class:`~modulelens.cancellation.CallCancelled` after killing it when the call is cancelled.
    The worker's whole process group (torchrun's ranks, the script's own children) is killed
    whenever this function leaves before the worker ended.
    """
    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{CALLER_ENV: this_process()})
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        text=True, errors="replace", start_new_session=True,
    )

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if relay_to_stderr:
                sys.stderr.write(line)
                sys.stderr.flush()

    relay = threading.Thread(target=pump, daemon=True)
    relay.start()
    try:
        code = _wait(proc, timeout, timeout_error)
    finally:
        kill_process_group(proc)
        relay.join(5)
    return WorkerExit(code=code, output_tail="\n".join(tail))


def _wait(proc: subprocess.Popen[str], timeout: float, timeout_error: ModuleLensError) -> int:
    """``proc``'s exit code; raises ``timeout_error`` or CallCancelled (leaving the kill to the caller)."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timeout_error
        try:
            return proc.wait(timeout=min(POLL_S, remaining))
        except subprocess.TimeoutExpired:
            if cancel_requested():
                raise CallCancelled("the worker process") from None


def kill_process_group(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc``'s process group (it was started with ``start_new_session``) and reap ``proc``.
    Does nothing to a group whose leader has ended and been reaped, and whose members are gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def read_worker_result(path: Path, model: type[Res]) -> Res | None:
    """The result a worker wrote to ``path``; None when it wrote none. A failure the worker
    reported is raised as a :class:`ModuleLensError` with its message and hint."""
    if not path.is_file():
        return None
    text = path.read_text()
    if not _Outcome.model_validate_json(text).ok:
        raise WorkerFailure.model_validate_json(text).to_error()
    return model.model_validate_json(text)


def worker_main(
    run: Callable[[Any], BaseModel | dict[str, Any]],
    request_file: Path,
    result_file: Path,
    what: str,
    *,
    request_model: type[BaseModel] | None = None,
) -> None:
    """Body of a worker process: ``run(request)`` -> ``result_file``, then leave at once.

    The request is read with ``request_model.model_validate_json`` (without a model, as a JSON
    dict: transitional, for workers whose request is not typed yet). ``run`` returns its result
    model (or a dict), written with ``ok: true``. The caller always gets a result file: a
    ModuleLensError becomes a :class:`WorkerFailure` with its message and hint, any other exception
    an internal error with its traceback. ``os._exit`` so that user threads, process groups or
    atexit handlers cannot keep the worker alive."""
    import json

    watch_caller()
    try:
        text = request_file.read_text()
        request = request_model.model_validate_json(text) if request_model is not None else json.loads(text)
        result = run(request)
        fields = result.model_dump(mode="json") if isinstance(result, BaseModel) else dict(result)
        out = json.dumps({**fields, "ok": True})
    except ModuleLensError as e:
        out = WorkerFailure(error=e.message, hint=e.hint, type=type(e).__name__).model_dump_json()
    except BaseException as e:  # noqa: BLE001 - the caller must always get a result file
        out = WorkerFailure(
            error=f"internal error in the {what} worker: {type(e).__name__}: {e}",
            hint="please report this with the traceback: " + traceback.format_exc()[-1500:],
            type="InternalError",
        ).model_dump_json()
    result_file.write_text(out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _caller_gone() -> str | None:
    caller = os.environ.get(CALLER_ENV)
    if caller and not owner_alive(caller):
        return "its caller (the process that started this worker) has ended"
    return None


def watch_caller() -> None:
    """In a worker: as soon as the caller named in ``MODULELENS_CALLER`` is gone (checked every
    0.2 s by a daemon thread), kill this worker's process group (the worker, the script's own
    children, torchrun's ranks) and refuse to publish to the repository once it is gone (checked
    again just before the rename, see :func:`~modulelens.repo.store.set_publish_guard`)."""
    from modulelens.repo.store import set_publish_guard

    if not os.environ.get(CALLER_ENV):
        return
    set_publish_guard(_caller_gone)

    def watch() -> None:
        while _caller_gone() is None:
            time.sleep(POLL_S)
        try:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os._exit(70)

    threading.Thread(target=watch, name="modulelens-caller-watch", daemon=True).start()
