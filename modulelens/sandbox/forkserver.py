"""The fork server: contained processes in milliseconds instead of seconds.

A *template* is a process that has imported torch and the runtime of the processes it will make
(the harness module its caller names and that module's ``PRELOAD`` list) and that never runs
candidate code, never runs a torch operator, and never holds a task, a reference output or a
secret. Each process asked of it (:class:`SpawnRequest`) is a fork of it that sets itself up
before anything of the candidate's is loaded:

1. ``A`` (the fork): its own session and process group (the checker stops and kills it as one),
   dies with the template (``PR_SET_PDEATHSIG``), keeps only the descriptors it was sent (logs as
   stdout/stderr, a status pipe, the harness's channels and arena; everything else the template
   holds is closed), then enters new user, PID, network, mount and IPC namespaces
   (:func:`modulelens.sandbox.mounts.enter_namespaces`) and forks ``B``;
2. ``B`` is PID 1 of the new PID namespace: it dies with ``A``, mounts its own ``/proc``, takes the
   environment and working folder it was given and runs ``HARNESS.main(argv)``, which applies the
   remaining layers itself (private /tmp and /dev, rlimits, not dumpable, Landlock, seccomp) --
   the same code a freshly started candidate process runs;
3. ``A`` waits for ``B`` and writes ``B``'s exit code to the status pipe (a negative number for a
   signal), which its requester reads: the checker learns how the candidate died without being
   its parent. Killing ``A``'s process group kills ``B``, and with it the whole PID namespace.

Nothing a fork does reaches the template or a sibling: each has its own user and PID namespaces
(they cannot name one another), seccomp refuses ptrace and process_vm_readv, Landlock (ABI 6)
refuses signals out of its domain, and each is not dumpable.

**No thread pools before forking.** ``fork`` copies only the calling thread: a thread pool (OpenMP,
torch's intra-op pool, a Triton or CUDA helper thread) started in the template would be a pool
whose threads are missing in every fork, and its locks could be held forever. The template never
runs an operator (importing torch starts no thread; running one may) and checks before every fork
that it has exactly one thread, by counting ``/proc/self/task`` (:func:`thread_count`); with more,
it refuses to fork and its requester falls back to a fresh process (the isolation report says
why). CUDA is never initialised in a template (CUDA does not survive ``fork``): availability is
read without initialising it (:func:`cuda_present`).

**Environment.** A template is only valid for the environment it was started in: the Python
executable, the torch build, the device kind and modulelens's own files (:func:`environment_key`).
Its owner compares the key before each use and replaces a stale template.

**Where templates live.** A sandbox worker is itself a template (it forks a confined checker per
task and, on that checker's behalf, candidate processes: :mod:`modulelens.sandbox.worker`); a
process that is not a worker starts a standalone template the first time it needs one
(``python -m modulelens.sandbox.forkserver SOCKET_FD HARNESS``, :func:`template`). The worker
rather than a template process of its own, because a worker imports torch anyway: one import per
pool instead of two, and the checker, the candidate and the eager reference side of a timing all
start as forks of the same process, so they start alike.

**Why the template itself is not put in namespaces.** Its forks enter their own (nested ones would
add nothing: a fork cannot reach its template's namespaces either way), and the worker-template
also forks checkers, which must read the task's input artifacts as the user and stop and kill
candidate processes. What protects the template is that nothing of a candidate's ever runs in it,
it holds no secret (scrubbed environment, no key, no task: checkers read their tasks themselves;
the worker only relays their reports), and its forks close every descriptor they were not given.

Set ``MODULELENS_FORK_SERVER=0`` to start every candidate process fresh instead.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import importlib
import os
import platform
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import Field, TypeAdapter

from modulelens.sandbox import protocol
from modulelens.sandbox.worker_messages import Message

DISABLE = "MODULELENS_FORK_SERVER"
_PR_SET_PDEATHSIG = 1


class SpawnRequest(Message):
    """Fork a contained process running ``harness``. The descriptors sent with it are, in order:
    its stdout, its stderr, the status pipe's write end, then the harness's own descriptors, which
    it gets as 3, 4, ... (``argv`` names them so)."""

    kind: Literal["spawn"] = "spawn"
    harness: str = Field(description="A module inside modulelens with main(argv) -> int.")
    argv: list[str]
    env: dict[str, str]
    cwd: str


class Spawned(Message):
    kind: Literal["spawned"] = "spawned"
    pid: int = Field(0, description="The fork's pid (its process group), in the template's PID namespace.")
    error: str = Field("", description="Why no process was made.")


IDLE_POLL_S = 0.02  # how long a template with idle work left waits for a request before doing a step of it
REQUESTS: TypeAdapter[SpawnRequest] = TypeAdapter(SpawnRequest)
REPLIES: TypeAdapter[Spawned] = TypeAdapter(Spawned)


def _module_name(name: str) -> str:
    if not (name.startswith("modulelens.") and all(part.isidentifier() for part in name.split("."))):
        raise ValueError(f"a candidate harness must be a module inside modulelens, not {name!r}")
    return name


def thread_count() -> int:
    """Threads of this process, counted in ``/proc/self/task`` (1 where it cannot be read)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1 if threading.active_count() == 1 else threading.active_count()


def cuda_present() -> bool:
    """Whether torch can use a CUDA device here, found without initialising CUDA (which would make
    every later fork unable to use it): a CUDA build of torch and an NVIDIA device node."""
    import torch

    return bool(torch.version.cuda) and os.path.exists("/dev/nvidiactl")


@cache
def _package_files() -> list[Path]:
    return sorted(Path(__file__).resolve().parents[1].rglob("*.py"))


def environment_key() -> str:
    """What a template depends on: the Python executable, the torch build (its version and its
    files' times), whether an NVIDIA device is present, and modulelens's own files (names, sizes,
    modification times). Found without importing torch."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("torch")
    torch_files = [Path(spec.origin), Path(spec.origin).with_name("version.py")] if spec and spec.origin else []
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    h = hashlib.sha256(f"{sys.executable}\0{version}\0{os.path.exists('/dev/nvidiactl')}".encode())
    for path in [*torch_files, *_package_files()]:
        try:
            st = path.stat()
        except OSError:
            h.update(f"{path}\0gone".encode())
            continue
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()


def preload(harness: str) -> None:
    """Import ``harness`` and the modules its ``PRELOAD`` names (the runtime every process it
    serves imports anyway), so that forks find them imported."""
    module = importlib.import_module(_module_name(harness))
    for name in getattr(module, "PRELOAD", ()):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an optional runtime (triton) that is not installed


def _warm(harness: str) -> None:
    """Run the ``WARM`` functions ``harness`` names (``"modulelens.x:function"``): introspection
    whose result every fork can use, never candidate code and never a torch operator."""
    module = importlib.import_module(_module_name(harness))
    for target in getattr(module, "WARM", ()):
        name, _, function = target.partition(":")
        getattr(importlib.import_module(_module_name(name)), function)()


def idle_steps(harnesses: list[str]) -> list[Callable[[], None]]:
    """What a template does while idle, in order: :func:`preload` each harness, then its ``WARM``
    functions. Each step ends with ``gc.freeze()``: the template's objects are then never visited
    by a fork's garbage collector, which would otherwise copy every page holding one (about 0.1 s
    in a fork of a process with torch imported)."""
    def step(fn: Callable[[str], None], harness: str) -> Callable[[], None]:
        def run() -> None:
            fn(harness)
            gc.collect()  # garbage is not frozen with the rest
            gc.freeze()
        return run

    return [step(preload, h) for h in harnesses] + [step(_warm, h) for h in harnesses]


def run_idle_step(pending: list[Callable[[], None]]) -> None:
    """Run the first of ``pending`` (see :func:`idle_steps`), removing it."""
    pending.pop(0)()


# -- the template's side --------------------------------------------------------------------------

class ForkService:
    """Serves :class:`SpawnRequest` frames read from a socket; tracks and reaps its forks."""

    def __init__(self) -> None:
        self.children: set[int] = set()

    def handle(self, sock: int) -> bool:
        """Read one request from ``sock`` and answer it. False when the other end closed."""
        try:
            req, fds = protocol.receive_with_fds(sock, REQUESTS)
        except (OSError, ValueError):
            return False
        if req is None:
            return False
        try:
            reply = self._spawn(req, fds)
        finally:
            for fd in fds:
                os.close(fd)
        protocol.send(sock, reply)
        return True

    def _spawn(self, req: SpawnRequest, fds: list[int]) -> Spawned:
        try:
            _module_name(req.harness)
        except ValueError as e:
            return Spawned(error=str(e))
        if len(fds) < 3:
            return Spawned(error="a spawn request needs stdout, stderr and a status pipe")
        threads = thread_count()
        if threads != 1:
            return Spawned(error=f"the template has {threads} threads (a fork would lack them)")
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            _become_child(req, fds, parent)  # never returns
        self.children.add(pid)
        return Spawned(pid=pid)

    def reap(self) -> None:
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)

    def kill_all(self) -> None:
        """Kill every fork still running (their namespaces die with them) and reap them."""
        for pid in list(self.children):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            self.children.discard(pid)


def _place_descriptors(fds: list[int]) -> int:
    """Put stdout/stderr on 1/2, the harness's descriptors on 3, 4, ..., the status pipe after them,
    /dev/null on 0, and close everything else. Returns the status pipe's number."""
    import fcntl

    floor = 3 + len(fds) + 8  # copies above every number they are moved to
    out, err, status, *harness = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
    os.dup2(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC), 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for i, fd in enumerate(harness):
        os.dup2(fd, 3 + i)
    status_at = 3 + len(harness)
    os.dup2(status, status_at, inheritable=False)
    _close_above(status_at + 1)
    return status_at


def _close_above(lowest: int) -> None:
    """Close every descriptor from ``lowest`` up (what the template held: its sockets, pipes, files)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        os.closerange(lowest, 65536)
        return
    for name in names:
        if name.isdigit() and int(name) >= lowest:
            try:
                os.close(int(name))
            except OSError:
                pass


def _become_child(req: SpawnRequest, fds: list[int], template: int) -> None:
    """The fork ``A`` (see the module docstring). Never returns."""
    code = 70
    try:
        os.setsid()
        die_with_parent(template)
        status = _place_descriptors(fds)
        from modulelens.sandbox.mounts import enter_namespaces

        entered, why = enter_namespaces()
        life_r, life_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(life_w)
            os.close(status)
            _run_harness(req, entered, why, life_r)  # never returns
        os.close(life_r)
        for fd in range(3, status):
            os.close(fd)
        while True:
            try:
                _, wait_status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        os.write(status, str(os.waitstatus_to_exitcode(wait_status)).encode())
        code = 0
    except BaseException:  # noqa: BLE001 - the requester sees the status pipe close and reads stderr
        traceback.print_exc()
    finally:
        exit_now(code)


def _run_harness(req: SpawnRequest, entered: str, why: str, life: int) -> None:
    """The process ``B``: PID 1 of its namespace when ``entered``. Never returns."""
    code = 70
    try:
        die_with_parent(None)
        ready, _, _ = select.select([life], [], [], 0)
        if ready:  # A died before we could die with it
            os._exit(1)
        os.close(life)
        if entered:
            failed = _own_proc()
            if failed:
                entered, why = "", failed
        template_cwd = os.getcwd()
        os.environ.clear()
        os.environ.update(req.env)
        os.environ["MODULELENS_NAMESPACES"] = entered
        os.environ["MODULELENS_NAMESPACES_MISSING"] = "" if entered else why
        os.chdir(req.cwd)
        tempfile.tempdir = None  # the template's temporary folder is not this process's
        sys.path[:] = [req.cwd] + [p for p in sys.path if p not in ("", template_cwd)]
        sys.argv = [req.harness, *req.argv]
        code = int(importlib.import_module(req.harness).main(req.argv) or 0)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        exit_now(code)


def exit_now(code: int) -> None:
    """End a forked process: flush its streams, skip the exit handlers it inherited."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


def _own_proc() -> str:
    from modulelens.sandbox.mounts import mount_own_proc

    return mount_own_proc() if os.getpid() == 1 else "not PID 1 of a new PID namespace"


def die_with_parent(expected: int | None = None) -> None:
    """Be killed when the parent dies; when ``expected`` is its pid and it is gone already, exit."""
    if platform.system() != "Linux":
        return
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if expected is not None and os.getppid() != expected:
        os._exit(1)


def serve(sock: int, harness: str) -> int:
    """A standalone template: preload ``harness``, then answer spawn requests on ``sock`` until it
    closes; every fork still running is killed on the way out."""
    pending = idle_steps([harness])
    run_idle_step(pending)  # the harness's imports before the first fork; the rest while idle
    service = ForkService()
    try:
        while True:
            ready, _, _ = select.select([sock], [], [], IDLE_POLL_S if pending else 0.5)
            service.reap()
            if not ready and pending:
                run_idle_step(pending)
            if ready and not service.handle(sock):
                return 0
    finally:
        service.kill_all()


# -- the requester's side --------------------------------------------------------------------------

class ForkClient:
    """A connection to a template: :meth:`spawn` asks it for one contained process."""

    def __init__(self, sock: int, process: subprocess.Popen | None = None, key: str = ""):
        self.sock, self.process, self.key = sock, process, key
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def spawn(self, req: SpawnRequest, fds: list[int], timeout: float = 300.0) -> Spawned:
        """Ask for a fork; an answer with ``error`` (or a template that died) means none was made."""
        with self.lock:
            try:
                protocol.send(self.sock, req, fds)
                ready, _, _ = select.select([self.sock], [], [], timeout)
                reply = protocol.receive(self.sock, REPLIES) if ready else None
            except (OSError, ValueError) as e:
                return Spawned(error=f"the template did not answer: {e}")
        if reply is None:
            return Spawned(error="the template did not answer (it died or is stuck)")
        return reply

    def close(self) -> None:
        try:
            os.close(self.sock)
        except OSError:
            pass
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_INHERITED: dict[str, ForkClient] = {}
_STARTED: dict[str, ForkClient] = {}
_LOCK = threading.Lock()


def use_inherited(sock: int) -> None:
    """(In a checker forked by a worker) the worker's socket is the template to ask."""
    _INHERITED["any"] = ForkClient(sock)


def template(harness: str, environment: dict[str, str]) -> tuple[ForkClient | None, str]:
    """(client, '') of the template to fork ``harness`` processes from, or (None, why not): the
    worker this process was forked from, else a standalone template started now (and replaced
    when its environment changed). ``environment``: what the template runs with (scrubbed; its
    forks get their own)."""
    harness = _module_name(harness)
    if os.environ.get(DISABLE, "1") == "0":
        return None, f"disabled ({DISABLE}=0)"
    if platform.system() != "Linux":
        return None, "not Linux"
    if "any" in _INHERITED:
        return _INHERITED["any"], ""
    key = environment_key()
    with _LOCK:
        found = _STARTED.get(harness)
        if found is not None and (not found.alive() or found.key != key):
            found.close()
            found = None
        if found is None:
            try:
                found = _start(harness, environment, key)
            except OSError as e:
                return None, f"the template could not be started: {e}"
            _STARTED[harness] = found
        return found, ""


def _start(harness: str, environment: dict[str, str], key: str) -> ForkClient:
    from modulelens.workers import module_command  # here, not at the top: the template never needs it

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = subprocess.Popen(
            module_command("modulelens.sandbox.forkserver", [str(theirs.fileno()), harness]),
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=environment, cwd=environment.get("HOME") or None,
            preexec_fn=die_with_parent)
    finally:
        theirs.close()
    import atexit

    client = ForkClient(ours.detach(), process, key)
    atexit.register(client.close)
    return client


def main(argv: list[str]) -> int:
    sock, harness = int(argv[0]), argv[1]
    return serve(sock, harness)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
