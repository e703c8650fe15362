"""The checker's handle on one candidate process: start it contained, send it requests, and kill
everything it started.

What runs in it is the caller's: the harness module (inside modulelens, fixed by the caller's
code) and the TypeAdapter of its replies. One candidate, one process: a process that ran a
candidate is never given another. It is started as ``unshare ... python -m HARNESS REQ_FD
REPLY_FD ARENA_FD SCRATCH MEMORY_MB [READ_ONLY_DIR ...]`` where namespaces are available
(:func:`modulelens.sandbox.containment.namespace_prefix`), in a new session, with a scrubbed
environment, its stdout and stderr in files of its scratch folder (the only place it may write),
and three inherited descriptors: requests, replies and the shared arena. :meth:`close` kills its
process group; with a PID namespace that kills every process it started, ``setsid`` ones too.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from modulelens.sandbox import protocol
from modulelens.sandbox.containment import namespace_prefix
from modulelens.sandbox.shm import SharedArena


class CandidateDied(Exception):
    """The candidate process ended or outlived its time; ``reason`` says which, in words."""

    def __init__(self, reason: str, stderr_tail: str = ""):
        super().__init__(reason)
        self.reason, self.stderr_tail = reason, stderr_tail


def _scrubbed_environment(scratch: Path) -> dict[str, str]:
    from modulelens.sandbox.pool import scrubbed_environment

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


OWNER = "owner.pid"


def remove_orphaned_scratch(folder: Path, min_age_s: float = 60.0) -> list[Path]:
    """Remove scratch folders left by checkers that were killed (their ``owner.pid`` names a
    process that is gone) and that are older than ``min_age_s``. Returns what was removed."""
    removed = []
    now = time.time()
    for path in folder.glob("modulelens-candidate-*"):
        try:
            if now - path.stat().st_mtime < min_age_s:
                continue
            pid = int((path / OWNER).read_text())
        except (OSError, ValueError):
            pid = 0
        if pid and _alive(pid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _die_with_parent() -> None:
    """(In the child, before exec) be killed when the checker dies, however it dies."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _module_name(name: str) -> str:
    if not (name.startswith("modulelens.") and all(part.isidentifier() for part in name.split("."))):
        raise ValueError(f"a candidate harness must be a module inside modulelens, not {name!r}")
    return name


class CandidateProcess:
    """A contained process that runs one candidate under ``harness`` (a module inside modulelens,
    run with ``python -m``), whose replies are read as ``replies``. ``read_only`` are folders it
    may read (the shared build cache); its scratch folder goes under ``parent`` (see
    :func:`scratch_parent`)."""

    def __init__(self, harness: str, replies: TypeAdapter[Any], *, memory_limit_mb: int, read_only: list[Path],
                 parent: Path):
        harness = _module_name(harness)  # before anything is started
        self.replies = replies
        self.read_only = list(read_only)
        self.scratch = Path(tempfile.mkdtemp(prefix="modulelens-candidate-", dir=parent))
        for sub in ("tmp", "build", "cache"):
            (self.scratch / sub).mkdir()
        (self.scratch / OWNER).write_text(str(os.getpid()))
        self.arena = SharedArena()
        self.stderr_path = self.scratch / "stderr.log"
        self.stdout_path = self.scratch / "stdout.log"
        req_r, self._req_w = os.pipe()
        self._reply_r, reply_w = os.pipe()
        prefix, described = namespace_prefix()
        env = _scrubbed_environment(self.scratch)
        if prefix:
            env["MODULELENS_NAMESPACES"] = described
        self.namespaces = described if prefix else ""
        self.namespaces_missing = "" if prefix else described
        cmd = [*prefix, sys.executable, "-m", harness, str(req_r), str(reply_w),
               str(self.arena.fd), str(self.scratch), str(memory_limit_mb), *map(str, read_only)]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, pass_fds=(req_r, reply_w, self.arena.fd), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err, cwd=self.scratch, env=env, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        os.close(req_r)
        os.close(reply_w)
        self.stage = "starting"

    # -- requests ------------------------------------------------------------------------------
    def request(self, req: BaseModel, timeout: float) -> Any:
        """Send ``req`` and wait for its reply. Raises :class:`CandidateDied`."""
        try:
            protocol.send(self._req_w, req)
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
            if self.proc.poll() is not None:
                raise CandidateDied(self._death_reason(), self.stderr_tail())

    # -- observing it from outside ---------------------------------------------------------------
    def candidate_pid(self) -> int:
        """The pid (in this PID namespace) of the process running candidate code: the child of
        ``unshare --fork`` when started in namespaces, else the started process itself."""
        if not self.namespaces:
            return self.proc.pid
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return self.proc.pid
        return int(children[0]) if children else self.proc.pid

    def mapped_files(self) -> set[str]:
        """The files mapped into the candidate's process now, from ``/proc/PID/maps`` (written by
        the kernel: the candidate cannot forge it). Empty when it cannot be read."""
        try:
            text = Path(f"/proc/{self.candidate_pid()}/maps").read_text()
        except OSError:
            return set()
        return {line.split(None, 5)[5] for line in text.splitlines() if len(line.split(None, 5)) == 6
                and line.split(None, 5)[5].startswith("/")}

    # -- pausing and ending ----------------------------------------------------------------------
    def pause(self) -> None:
        """Stop the candidate's process group (while the checker times eager)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stdout_bytes(self) -> int:
        try:
            return self.stdout_path.stat().st_size
        except OSError:
            return 0

    def stderr_tail(self, n: int = 1500) -> str:
        try:
            return self.stderr_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def _death_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
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
        """Kill the process group (and with it the PID namespace) and release the arena's pipes.
        The scratch folder stays until :meth:`remove`."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._req_w, self._reply_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._req_w = self._reply_r = -1

    def remove(self) -> None:
        self.close()
        self.arena.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
