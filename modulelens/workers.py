"""One-shot worker processes that run user code (capture, statistics, runs with a pack): both sides.

User code never runs in the tool's process: it gets its own ``sys.argv``, ``__main__`` and stdout
(an MCP server's stdout is its protocol stream), and it can crash or hang without harming the
caller. Every such worker is ``python -m MODULE REQUEST.json OUT_DIR`` (under ``torchrun`` when
several processes run it), and both sides of the protocol live here:

* parent: :func:`launch_worker` makes a temporary folder, writes the typed request there, starts
  the worker (:func:`module_command`; the caller's environment, unbuffered, with the caller named
  in ``MODULELENS_CALLER``; in the folder the caller names, which ``-m`` also puts first on
  ``sys.path``: where the user would run the script, not the server's), relays its output to
  stderr (never stdout), applies the timeout, and returns the typed result of every process that
  wrote one (:class:`WorkerRun`), or raises :class:`WorkerDied` (naming the worker, how it ended
  and its last output) when none did. :func:`run_worker_process` is the process part alone.
* child: :func:`worker_main` reads the request (``model_validate_json``), runs, writes one result
  file (:func:`result_path`) and ends the process at once.

The worker runs in its own process group, which is killed whenever the parent stops waiting
(a timeout, a cancelled call — see :mod:`modulelens.cancellation` — or any exception such as
Ctrl-C). The other way round, the worker watches its caller (named in ``MODULELENS_CALLER``): when
the caller dies (``kill -9`` of the CLI or the MCP server) the worker kills its process group
within a second, and it never publishes an artifact once its caller is gone (the repository's
publish guard).

A result file holds either the worker's result (a :class:`WorkerResult` subclass, ``ok: true``)
or a :class:`WorkerFailure` (``ok: false``, the error's message and hint). The child always writes
one, unless the interpreter itself dies (segfault, out of memory): then there is no file.

The sandbox's workers (:mod:`modulelens.sandbox.pool`) share :func:`module_command` and
:func:`how_it_ended` only (the fork server's template and the detached job processes of
:mod:`modulelens.jobs` share :func:`module_command`). The rest differs on purpose: they are long-lived pool processes that
take many tasks over pipes, run untrusted candidates (an allow-listed environment, not the
caller's; their output goes to files in a scratch folder, not to stderr; a memory limit), and a
crash there is a verdict on a candidate, not an error of the call.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from modulelens.cancellation import CallCancelled, cancel_requested
from modulelens.errors import ModuleLensError
from modulelens.repo import owner_alive, this_process

OUTPUT_TAIL_LINES = 40
OUTPUT_TAIL_CHARS = 1500  # of the last output, in the error of a worker that died
REQUEST_FILE = "request.json"
_RESULT_FILE = re.compile(r"^result(?:-rank(\d+))?\.json$")
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


class WorkerDied(ModuleLensError):
    """A worker process that ended without writing its result: the interpreter itself died
    (segfault, out of memory, killed), so the worker could not report an error."""


def module_command(module: str, args: Sequence[str] = (), *, nproc: int = 1) -> list[str]:
    """``python -m MODULE ARGS`` with this interpreter; with ``nproc`` > 1, ``nproc`` processes of it
    under ``torchrun --standalone`` on this host."""
    run = ["-m", module, *args]
    if nproc > 1:
        run = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *run]
    return [sys.executable, *run]


def how_it_ended(code: int) -> str:
    """A process's end in words from its return code: ``exited with code 3``, ``crashed with SIGSEGV``."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"crashed with {signal.Signals(-code).name}"
    except ValueError:
        return f"crashed with signal {-code}"


@dataclass(frozen=True)
class WorkerRun(Generic[Res]):
    """What a worker left: the result of each process that wrote one, by rank (0 without
    torchrun, in rank order), how the worker ended and the last lines it printed."""

    what: str
    results: dict[int, Res]
    exit_code: int
    output_tail: str

    def result(self, rank: int = 0) -> Res:
        """The result of ``rank``; raises :class:`WorkerDied` when that process wrote none."""
        found = self.results.get(rank)
        if found is None:
            raise self.died(rank if self.results else None)
        return found

    def died(self, rank: int | None = None) -> WorkerDied:
        """The error of a worker (or of its process ``rank``) that ended without a result."""
        who = f"the {self.what} worker" + (f" (rank {rank})" if rank is not None else "")
        return WorkerDied(
            f"{who} {how_it_ended(self.exit_code)} without a result",
            "the script may have crashed the interpreter (segfault, out of memory); last output:\n"
            + self.output_tail[-OUTPUT_TAIL_CHARS:],
        )


def launch_worker(
    module: str, request: BaseModel, result_model: type[Res], *, what: str, timeout: float,
    timeout_error: ModuleLensError, cwd: str | os.PathLike[str], nproc: int = 1, relay_prefix: str = "",
    on_line: Callable[[str], None] | None = None,
) -> WorkerRun[Res]:
    """Run ``python -m module REQUEST.json OUT_DIR`` (``nproc`` processes under torchrun when > 1)
    in the folder ``cwd`` to its end, ``request`` written to REQUEST.json in a temporary OUT_DIR, its
    output relayed to stderr, and read the result each process wrote there (:func:`worker_main` on
    the other side).

    ``what`` names the worker in errors (``capture``, ``statistics``); ``relay_prefix`` starts each
    relayed line (which of several runs printed it); ``on_line`` hears each line the worker prints
    (a caller's progress: what the script is doing). Raises the first failure a
    process reported (its ModuleLensError, in rank order), ``timeout_error`` when it ran longer than
    ``timeout`` seconds, :class:`~modulelens.cancellation.CallCancelled` when the call was
    cancelled, and :class:`WorkerDied` when no process wrote a result."""
    with tempfile.TemporaryDirectory(prefix=f"modulelens-{what}-") as tmp:
        out_dir = Path(tmp)
        request_file = out_dir / REQUEST_FILE
        request_file.write_text(request.model_dump_json())
        done = run_worker_process(module_command(module, [str(request_file), tmp], nproc=nproc), cwd=cwd,
                                  relay_to_stderr=True, timeout=timeout, timeout_error=timeout_error,
                                  relay_prefix=relay_prefix, on_line=on_line)
        results = read_worker_results(out_dir, result_model)
    run = WorkerRun(what=what, results=results, exit_code=done.code, output_tail=done.output_tail)
    if not results:
        raise run.died()
    return run


def run_worker_process(
    cmd: list[str], *, relay_to_stderr: bool, timeout: float, timeout_error: ModuleLensError,
    cwd: str | os.PathLike[str] | None = None, relay_prefix: str = "",
    on_line: Callable[[str], None] | None = None,
) -> WorkerExit:
    """Run a worker command to its end in the folder ``cwd`` (None: ours), its stdout and stderr
    relayed line by line to our stderr when ``relay_to_stderr`` (never to our stdout: with MCP over
    stdio, stdout is the protocol), each line after ``relay_prefix`` (the tail keeps them as printed). A ``cwd`` that is not a folder is a one-line ModuleLensError.

    Raises ``timeout_error`` after killing the worker when it runs longer than ``timeout`` seconds,
    and :class:`~modulelens.cancellation.CallCancelled` after killing it when the call is cancelled.
    The worker's whole process group (torchrun's ranks, the script's own children) is killed
    whenever this function leaves before the worker ended.
    """
    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
    if cwd is not None and not Path(cwd).is_dir():
        raise ModuleLensError(f"the folder to run the script in, {cwd}, is not a folder",
                              "run from (or pass the repository of) an existing project folder")
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{CALLER_ENV: this_process()})
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
        text=True, errors="replace", start_new_session=True,
    )

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if on_line is not None:
                try:
                    on_line(line.rstrip("\n"))
                except Exception:  # noqa: BLE001  (a listener never stops the relay)
                    pass
            if relay_to_stderr:
                sys.stderr.write(relay_prefix + line)
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


def read_worker_results(out_dir: Path, model: type[Res]) -> dict[int, Res]:
    """The results the processes of a worker wrote to ``out_dir`` (:func:`result_path`), by rank
    (0 for ``result.json``), in rank order; raises the first failure one reported."""
    ranks = {}
    for path in out_dir.iterdir():
        match = _RESULT_FILE.match(path.name)
        if match:
            ranks[int(match[1] or 0)] = path
    results = {}
    for rank in sorted(ranks):
        result = read_worker_result(ranks[rank], model)
        if result is not None:
            results[rank] = result
    return results


def distributed_rank() -> int | None:
    """This process's rank under torchrun (None outside a distributed launch)."""
    return int(os.environ["RANK"]) if "RANK" in os.environ and "WORLD_SIZE" in os.environ else None


def result_path(out_dir: Path) -> Path:
    """Where a worker process writes its result: ``OUT_DIR/result.json``, or
    ``OUT_DIR/result-rank<R>.json`` under torchrun."""
    rank = distributed_rank()
    return out_dir / ("result.json" if rank is None else f"result-rank{rank}.json")


def worker_main(
    run: Callable[[Req], BaseModel], argv: Sequence[str], what: str, request_model: type[Req]
) -> None:
    """Body of a worker process started by :func:`launch_worker` (``argv``: ``REQUEST.json OUT_DIR``):
    ``run(request)`` -> :func:`result_path`, then leave at once.

    The request is read with ``request_model.model_validate_json``; ``run`` returns its result
    model, written with ``ok: true``. The caller always gets a result file: a ModuleLensError
    becomes a :class:`WorkerFailure` with its message and hint, any other exception an internal
    error with its traceback. ``os._exit`` so that user threads, process groups or atexit handlers
    cannot keep the worker alive."""
    watch_caller()
    try:
        request = request_model.model_validate_json(Path(argv[0]).read_text())
        out = json.dumps({**run(request).model_dump(mode="json"), "ok": True})
    except ModuleLensError as e:
        out = WorkerFailure(error=e.message, hint=e.hint, type=type(e).__name__).model_dump_json()
    except BaseException as e:  # noqa: BLE001 - the caller must always get a result file
        out = WorkerFailure(
            error=f"internal error in the {what} worker: {type(e).__name__}: {e}",
            hint="please report this with the traceback: " + traceback.format_exc()[-1500:],
            type="InternalError",
        ).model_dump_json()
    result_path(Path(argv[1])).write_text(out)
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
    from modulelens.repo import set_publish_guard

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
