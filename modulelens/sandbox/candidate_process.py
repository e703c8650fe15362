"""The checker's handle on one candidate process: start it contained, send it requests, and kill
everything it started.

What runs in it is the caller's: the harness module (inside modulelens, fixed by the caller's
code) and the TypeAdapter of its replies. One candidate, one process: a process that ran a
candidate is never given another. It runs ``HARNESS.main([REQ_FD, REPLY_FD, ARENA_FD, SCRATCH,
MEMORY_MB, READ_ONLY_DIR...])`` and is made one of two ways, each saying so in :attr:`layers`:

* **forked** from a template (:mod:`modulelens.sandbox.forkserver`; milliseconds): the worker this
  checker was forked from, or a standalone template this process started;
* **fresh** (seconds: Python and torch are imported again): ``unshare ... python -m HARNESS ...``
  where namespaces are available (:func:`modulelens.sandbox.containment.namespace_prefix`), when
  there is no usable template (``MODULELENS_FORK_SERVER=0``, not Linux, a template that refused).

Either way it gets a scrubbed environment, a new session, and exactly these descriptors: requests
(a Unix socket pair: a bigger arena is sent over it as a descriptor), replies (a pipe), the sealed
shared arena, and as stdout/stderr two unlinked files this process opened (nothing the candidate
can replace by a link: their contents are read through the descriptors held here). Its scratch
folder (the only place it may write) is named after this process (``modulelens-candidate-PID.START-...``)
so that a checker that was killed is recognised without reading anything the candidate wrote, and
it is removed by :func:`modulelens.sandbox.cleanup.remove_tree`, which no depth, name or permission
stops. :meth:`close` kills its process group; with a PID namespace that kills every process it
started, ``setsid`` ones too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from modulelens.repo import owner_alive, this_process
from modulelens.sandbox import forkserver, protocol
from modulelens.sandbox.cleanup import remove_tree
from modulelens.sandbox.containment import Layer, namespace_prefix
from modulelens.sandbox.pool import scrubbed_environment, template_environment
from modulelens.sandbox.shm import SharedArena

PREFIX = "modulelens-candidate-"
MASKED_VARIABLE = "MODULELENS_MASKED"  # the paths the harness covers in its mount namespace (a JSON list)


class CandidateDied(Exception):
    """The candidate process ended or outlived its time; ``reason`` says which, in words."""

    def __init__(self, reason: str, stderr_tail: str = ""):
        super().__init__(reason)
        self.reason, self.stderr_tail = reason, stderr_tail


def _scrubbed_environment(scratch: Path) -> dict[str, str]:
    env = scrubbed_environment(scratch)
    env.update(XDG_CACHE_HOME=str(scratch / "cache"), TRITON_CACHE_DIR=str(scratch / "triton"),
               TORCH_EXTENSIONS_DIR=str(scratch / "torch_extensions"))
    env.pop("MODULELENS_BUILD_DIR", None)
    env.pop("MODULELENS_CONFIG_DIR", None)
    return env


def scratch_parent(folder: Path) -> Path:
    """``folder``, made ready to hold candidate scratch folders (created; scratch folders of
    killed checkers removed). It must not be under /tmp, which the candidate's mount namespace
    replaces with its own."""
    folder.mkdir(parents=True, exist_ok=True)
    remove_orphaned_scratch(folder)
    return folder


UNNAMED_MAX_AGE_S = 24 * 3600.0  # scratch folders named before owners were (no owner to ask): a day


def remove_orphaned_scratch(folder: Path, min_age_s: float = 60.0) -> list[Path]:
    """Remove scratch folders left by checkers that were killed (the owner in the folder's name is
    a process that is gone) and that are older than ``min_age_s``; folders without an owner in
    their name (older versions) only after :data:`UNNAMED_MAX_AGE_S`. Returns what was removed.
    Only the folder's name and age are read, never a file a candidate could have written."""
    removed = []
    now = time.time()
    for path in folder.glob(f"{PREFIX}*"):
        owner = path.name[len(PREFIX):].split("-", 1)[0]
        named = "." in owner and owner.split(".", 1)[0].isdigit()
        try:
            if now - path.lstat().st_mtime < (min_age_s if named else UNNAMED_MAX_AGE_S):
                continue
        except OSError:
            continue
        if named and owner_alive(owner):
            continue
        remove_tree(path)
        removed.append(path)
    return removed


class _Fresh:
    """A candidate process started from scratch (``unshare ... python -m HARNESS``)."""

    def __init__(self, harness: str, argv: list[str], env: dict[str, str], cwd: Path, out: int, err: int,
                 pass_fds: list[int]):
        prefix, described = namespace_prefix()
        if prefix:
            env["MODULELENS_NAMESPACES"] = described
        else:
            env["MODULELENS_NAMESPACES_MISSING"] = described
        self.popen = subprocess.Popen([*prefix, sys.executable, "-m", harness, *argv], pass_fds=pass_fds,
                                      stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd, env=env,
                                      start_new_session=True, preexec_fn=forkserver.die_with_parent)
        self.pid = self.popen.pid
        self.in_namespaces = bool(prefix)

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()

    def release(self) -> None:
        pass


class _Forked:
    """A candidate process forked from a template: ``pid`` is the fork ``A`` (its process group),
    whose child runs the harness; how that child ended arrives on the status pipe."""

    def __init__(self, client: forkserver.ForkClient, harness: str, argv: list[str], env: dict[str, str], cwd: Path,
                 out: int, err: int, pass_fds: list[int]):
        self._status, status_w = os.pipe()
        try:
            reply = client.spawn(forkserver.SpawnRequest(harness=harness, argv=argv, env=env, cwd=str(cwd)),
                                 [out, err, status_w, *pass_fds])
        finally:
            os.close(status_w)
        if reply.error:
            os.close(self._status)
            raise OSError(reply.error)
        self.pid = reply.pid
        self.code: int | None = None
        self.in_namespaces = True

    def poll(self) -> int | None:
        if self.code is None and select.select([self._status], [], [], 0)[0]:
            self._read()
        return self.code

    def _read(self) -> None:
        data = os.read(self._status, 64)
        try:
            self.code = int(data) if data else -signal.SIGKILL  # no word: the fork itself was killed
        except ValueError:
            self.code = -signal.SIGKILL

    def wait(self, timeout: float) -> int:
        if self.code is None:
            if not select.select([self._status], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("candidate", timeout)
            self._read()
        return self.code  # type: ignore[return-value]

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def release(self) -> None:
        try:
            os.close(self._status)
        except OSError:
            pass


class CandidateProcess:
    """A contained process that runs one candidate under ``harness`` (a module inside modulelens
    with ``main(argv)``), whose replies are read as ``replies``. ``read_only`` are folders it may
    read (the shared build cache); ``masked`` are paths it must find empty whatever else it may
    read (the repository, the signing key: the harness covers them in its mount namespace,
    :func:`modulelens.sandbox.mounts.mask_paths`, told by :data:`MASKED_VARIABLE`); its scratch
    folder goes under ``parent`` (see :func:`scratch_parent`). :attr:`layers` says how it was made (forked or fresh) and whether
    its arena is sealed, for the isolation report."""

    def __init__(self, harness: str, replies: TypeAdapter[Any], *, memory_limit_mb: int, read_only: list[Path],
                 parent: Path, masked: list[Path] = ()):
        harness = forkserver._module_name(harness)  # before anything is started
        self.replies = replies
        self.read_only = list(read_only)
        self.masked = list(masked)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{this_process()}-", dir=parent))
        for sub in ("tmp", "build", "cache"):
            (self.scratch / sub).mkdir()
        self.arena = SharedArena()
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._req = ours.detach()
        req_child = theirs.detach()
        self._reply_r, reply_w = os.pipe()
        self._maps: int | None = None
        self._sampler: list[int] = []
        env = _scrubbed_environment(self.scratch)
        if self.masked:
            env[MASKED_VARIABLE] = json.dumps([str(p) for p in self.masked])
        fds = [req_child, reply_w, self.arena.fd]
        rest = [str(self.scratch), str(memory_limit_mb), *map(str, read_only)]
        self.layers: list[Layer] = []
        self._launch: _Fresh | _Forked | None = None
        try:
            client, why = forkserver.template(harness, template_environment(parent))
            if client is not None:
                try:
                    self._launch = _Forked(client, harness, ["3", "4", "5", *rest], dict(env), self.scratch,
                                           self._out.fileno(), self._err.fileno(), fds)
                    self.layers.append(Layer(name="fork server", in_force=True, detail=(
                        "forked from a template that never ran candidate code; its own session, namespaces and "
                        "layers before the candidate loaded")))
                except OSError as e:
                    why = str(e)
            if self._launch is None:
                self._launch = _Fresh(harness, [*map(str, fds), *rest], dict(env), self.scratch, self._out.fileno(),
                                      self._err.fileno(), fds)
                self.layers.append(Layer(name="fork server", in_force=False,
                                         detail=f"{why}: started as a fresh process instead"))
        finally:
            for fd in (req_child, reply_w):
                os.close(fd)
        self.layers.append(Layer(name="sealed shared memory", in_force=self.arena.sealed, detail=(
            "the arena cannot shrink or grow; the checker reads it by pread, never mapped" if self.arena.sealed
            else "no memfd sealing here; the checker reads the arena by pread, never mapped")))
        self._sent_generation = self.arena.generation
        self.namespaces = "forked" if isinstance(self._launch, _Forked) else ""
        if isinstance(self._launch, _Fresh):
            self.namespaces = "fresh" if self._launch.in_namespaces else ""
        self.namespaces_missing = ""  # the harness reports its namespaces itself
        self.pid = self._launch.pid
        self.stage = "starting"

    # -- requests ------------------------------------------------------------------------------
    def request(self, req: BaseModel, timeout: float) -> Any:
        """Send ``req`` (with the arena's descriptor when it was replaced since) and wait for its
        reply. Raises :class:`CandidateDied`."""
        try:
            if self.arena.generation != self._sent_generation:
                protocol.send(self._req, req, [self.arena.fd])
                self._sent_generation = self.arena.generation
            else:
                protocol.send(self._req, req)
        except OSError:
            raise CandidateDied(self._death_reason(), self.stderr_tail()) from None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise CandidateDied(f"timed out after {timeout:.0f} s", self.stderr_tail())
            ready, _, _ = select.select([self._reply_r], [], [], min(remaining, 0.5))
            if ready:
                try:
                    reply = protocol.receive(self._reply_r, self.replies)
                except ValueError:  # not a frame of ours: the candidate wrote on the pipe
                    self.close()
                    raise CandidateDied("wrote a malformed reply on its pipe") from None
                if reply is None:
                    raise CandidateDied(self._death_reason(), self.stderr_tail())
                return reply
            if self._launch.poll() is not None:
                raise CandidateDied(self._death_reason(), self.stderr_tail())

    # -- observing it from outside ---------------------------------------------------------------
    def candidate_pid(self) -> int:
        """The pid (in this PID namespace) of the process running candidate code: the child of
        the fork or of ``unshare --fork`` when there is one, else the started process itself."""
        if not self.namespaces:
            return self.pid
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            return self.pid
        return int(children[0]) if children else self.pid

    def _maps_fd(self) -> int | None:
        """The descriptor of the candidate's ``/proc/self/maps`` it sent as its first message,
        before any candidate code ran (it is not dumpable: this process may not open it by path).
        Nothing more is read from the request socket afterwards."""
        if self._maps is None and self._req >= 0 and select.select([self._req], [], [], 0)[0]:
            try:
                _, fds = protocol.receive_fds(self._req, 1)
            except OSError:
                fds = []
            self._maps = fds[0] if fds else -1
            self._sampler = fds[1:]
            try:
                socket.socket(fileno=os.dup(self._req)).shutdown(socket.SHUT_RD)
            except OSError:
                pass
        return self._maps if self._maps is not None and self._maps >= 0 else None

    def sampler_fds(self) -> list[int]:
        """The descriptors of the candidate process's sampling events (one per CPU, disabled),
        sent with its maps descriptor before any candidate code ran; the candidate kept none.
        Empty where its kernel refused them. They stay this handle's (closed by :meth:`close`)."""
        self._maps_fd()
        return list(self._sampler)

    def maps(self) -> str:
        """The candidate's ``/proc/PID/maps`` now (written by the kernel: the candidate cannot forge
        it): address ranges, permissions, inodes and files. Empty when it cannot be read."""
        fd = self._maps_fd()
        try:
            if fd is not None:
                os.lseek(fd, 0, os.SEEK_SET)
                chunks = []
                while chunk := os.read(fd, 1 << 16):
                    chunks.append(chunk)
                return b"".join(chunks).decode(errors="replace")
            return Path(f"/proc/{self.candidate_pid()}/maps").read_text()
        except OSError:
            return ""

    def mapped_files(self) -> set[str]:
        """The files mapped into the candidate's process now (:meth:`maps`)."""
        return {line.split(None, 5)[5] for line in self.maps().splitlines() if len(line.split(None, 5)) == 6
                and line.split(None, 5)[5].startswith("/")}

    # -- pausing and ending ----------------------------------------------------------------------
    def pause(self) -> None:
        """Stop the candidate's process group (while the checker times eager)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stdout_bytes(self) -> int:
        try:
            return os.fstat(self._out.fileno()).st_size
        except (OSError, ValueError):
            return 0

    def stderr_tail(self, n: int = 1500) -> str:
        try:
            size = os.fstat(self._err.fileno()).st_size
            return os.pread(self._err.fileno(), n, max(0, size - n)).decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def _death_reason(self) -> str:
        try:
            code = self._launch.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.close()
            return "stopped answering"
        if code < 0 or code > 128:
            num = -code if code < 0 else code - 128
            try:
                name = signal.Signals(num).name
            except ValueError:
                name = f"signal {num}"
            return f"crashed with {name}"
        return f"exited with code {code}"

    def close(self) -> None:
        """Kill the process group (and with it the PID namespace) and release the channels. The
        scratch folder stays until :meth:`remove`."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGKILL)
        self._launch.kill()
        try:
            self._launch.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._req, self._reply_r, self._maps if self._maps and self._maps >= 0 else -1):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._req = self._reply_r = -1
        self._maps = -1
        for fd in self._sampler:
            try:
                os.close(fd)
            except OSError:
                pass
        self._sampler = []

    def remove(self) -> None:
        self.close()
        self._launch.release()
        self.arena.close()
        for f in (self._out, self._err):
            f.close()
        remove_tree(self.scratch)
