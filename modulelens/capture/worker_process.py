"""The protocol between a tool and a worker process that runs user code (capture, statistics).

User code never runs in the tool's process: it gets its own ``sys.argv``, ``__main__`` and stdout
(an MCP server's stdout is its protocol stream), and it can crash or hang without harming the
caller. Both sides of the protocol live here:

* parent: write the request model as JSON (``model_dump_json``), start the worker with
  :func:`run_worker_process` (its output relayed to stderr, never stdout; a timeout), then read each
  result file with :func:`read_worker_result`;
* child: :func:`worker_main` reads the request (``model_validate_json``), runs, writes one result
  file and ends the process at once.

A result file holds either the worker's result (a :class:`WorkerResult` subclass, ``ok: true``)
or a :class:`WorkerFailure` (``ok: false``, the error's message and hint). The child always writes
one, unless the interpreter itself dies (segfault, out of memory): then there is no file.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from modulelens.errors import ModuleLensError

OUTPUT_TAIL_LINES = 40

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

    Raises ``timeout_error`` after killing the worker when it runs longer than ``timeout`` seconds.
    """
    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        text=True, errors="replace",
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
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        relay.join(5)
        raise timeout_error from None
    relay.join(5)
    return WorkerExit(code=code, output_tail="\n".join(tail))


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
