"""Namespaces entered with system calls, and the mounts a contained process makes in its own mount
namespace: its own ``/proc``, a private ``/tmp`` and a minimal private ``/dev``.

A forked candidate (:mod:`modulelens.sandbox.forkserver`) enters its namespaces itself
(:func:`enter_namespaces`: ``unshare(2)`` of user, PID, network, mount and IPC namespaces, the user
namespace mapping only the caller's uid and gid), then forks once more so that the process that
runs the candidate is PID 1 of the new PID namespace and mounts its own ``/proc``
(:func:`mount_own_proc`); a candidate started fresh gets the same from the ``unshare`` binary.

:func:`private_dev` (both ways) replaces ``/dev`` by a small tmpfs holding only ``null``, ``zero``,
``full``, ``random``, ``urandom`` (bind mounts of the real nodes: a user namespace may not create
device nodes), the NVIDIA device nodes when the machine has them (CUDA candidates need them),
the ``fd``/``stdin``/``stdout``/``stderr`` links, and a private ``/dev/shm`` (its own tmpfs).
Nothing written under it reaches the host: no ``/dev/kmsg``, no host ``/dev/shm`` file, no
terminal. The nodes are bound from ``/proc/self/fd/N`` descriptors opened before ``/dev`` is
covered, so no path is looked up in the new tmpfs on the way.

:func:`mask_paths` covers the secrets the checker names (the repository, the signing key) in the
candidate's mount namespace before any candidate code exists: an empty read-only tmpfs on a
folder, an empty file from its private /tmp on a file. Whatever the candidate may read otherwise
(a project folder on its import path holding ``.modulelens``), they show nothing, and seccomp
(installed after) refuses the ``umount2`` and ``mount`` calls that could uncover them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from pathlib import Path

from modulelens.sandbox.containment import DEVICES, MASKED, USER_NAMESPACES_HINT, Layer, gpu_nodes

_libc = ctypes.CDLL(None, use_errno=True) if platform.system() == "Linux" else None
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (0x00020000, 0x08000000, 0x10000000,
                                                                          0x20000000, 0x40000000)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18
SHM_SIZE = "64m"


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces() -> tuple[str, str]:
    """Move this (single-threaded) process into new user, PID, network, mount and IPC namespaces
    (the PID namespace applies to the children it forks next). Returns (what was entered, why not):
    without a user namespace when the kernel refuses one (enough as root), nothing when neither
    works."""
    if _libc is None:
        return "", "not Linux"
    uid, gid = os.getuid(), os.getgid()
    rest = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC
    if _libc.unshare(CLONE_NEWUSER | rest) == 0:
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"0 {uid} 1")
            _write("/proc/self/gid_map", f"0 {gid} 1")
        except OSError as e:
            return "", f"user namespace maps: {e.strerror}"
        return "user, PID, network, mount, IPC", ""
    why = _errno_text()
    if _libc.unshare(rest) == 0:
        return "PID, network, mount, IPC (no user namespace)", ""
    return "", f"unshare: {why}; without a user namespace: {_errno_text()}"


def mount_own_proc() -> str:
    """(PID 1 of a new PID namespace, in a new mount namespace) keep mounts from propagating to the
    host and mount a ``/proc`` that shows only this namespace. Returns why not, or ''."""
    if _libc is None:
        return "not Linux"
    if _libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"making / private: {_errno_text()}"
    if _libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
        return f"mounting /proc: {_errno_text()}"
    return ""


def private_dev() -> Layer:
    """Replace ``/dev`` by the minimal private one described in the module docstring (only in a
    mount namespace of this process's own: PID 1 there)."""
    name = "private /dev"
    if _libc is None or os.getpid() != 1:
        return Layer(name=name, in_force=False, detail="no mount namespace")
    nodes = [f"/dev/{d}" for d in DEVICES if os.path.exists(f"/dev/{d}")] + gpu_nodes()
    held = {}
    try:
        for node in nodes:
            held[node] = os.open(node, os.O_PATH | os.O_CLOEXEC)
        if _libc.mount(b"tmpfs", b"/dev", b"tmpfs", _MS_NOSUID | _MS_NOEXEC, b"size=1m,mode=755") != 0:
            return Layer(name=name, in_force=False, detail=f"mounting a tmpfs on /dev: {_errno_text()}")
        for node, fd in held.items():
            Path(node).parent.mkdir(parents=True, exist_ok=True)
            Path(node).touch(mode=0o666)
            if _libc.mount(f"/proc/self/fd/{fd}".encode(), node.encode(), None, _MS_BIND, None) != 0:
                return Layer(name=name, in_force=False, detail=f"binding {node}: {_errno_text()}")
        os.mkdir("/dev/shm", 0o1777)
        if _libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV,
                       f"size={SHM_SIZE},mode=1777".encode()) != 0:
            return Layer(name=name, in_force=False, detail=f"mounting /dev/shm: {_errno_text()}")
        for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2")):
            os.symlink(target, f"/dev/{link}")
    except OSError as e:
        return Layer(name=name, in_force=False, detail=f"{e.strerror}: {e.filename}")
    finally:
        for fd in held.values():
            os.close(fd)
    gpu = [n for n in nodes if "nvidia" in n]
    return Layer(name=name, in_force=True, detail=f"a tmpfs with {', '.join(DEVICES)}"
                 + (f", {len(gpu)} NVIDIA node(s)" if gpu else "") + f" and its own /dev/shm ({SHM_SIZE})")


EMPTY_FILE = "/tmp/.modulelens-masked"  # in the candidate's private /tmp: bound over masked files


def mask_paths(paths: list[str], needed: list[str], private_tmp: bool) -> Layer:
    """Cover each of ``paths`` in this process's own mount namespace (PID 1 there): a folder by an
    empty read-only tmpfs, a file by an empty file of its private /tmp (``private_tmp``: in force).
    A path that does not exist here (hidden by the private /tmp, or not made yet) needs nothing; one
    holding a folder of ``needed`` (its scratch, the build cache) is left, and the layer is then
    not in force. In force when every path that exists is covered."""
    if _libc is None or os.getpid() != 1:
        return Layer(name=MASKED, in_force=False, detail=f"no mount namespace ({USER_NAMESPACES_HINT})")
    covered, absent = [], []
    for path in dict.fromkeys(os.path.realpath(p) for p in paths):
        if not os.path.lexists(path):
            absent.append(path)
            continue
        holds = [n for n in needed if Path(os.path.realpath(n)).is_relative_to(path)]
        if holds:
            return Layer(name=MASKED, in_force=False, detail=f"{path} holds {holds[0]}, which the candidate needs "
                         "(keep the build folder, MODULELENS_BUILD_DIR, outside the repository)")
        if os.path.isdir(path):
            done = _libc.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                               b"size=4k,mode=0555")
        elif private_tmp:
            if not os.path.exists(EMPTY_FILE):
                with open(EMPTY_FILE, "x"):
                    pass
                os.chmod(EMPTY_FILE, 0o444)
            done = _libc.mount(EMPTY_FILE.encode(), path.encode(), None, _MS_BIND, None)
        else:
            return Layer(name=MASKED, in_force=False, detail=f"{path} is a file and there is no private /tmp to "
                         "take an empty one from")
        if done != 0:
            return Layer(name=MASKED, in_force=False, detail=f"covering {path}: {_errno_text()}")
        covered.append(path)
    with contextlib.suppress(OSError):
        os.unlink(EMPTY_FILE)  # the mounts hold it
    return Layer(name=MASKED, in_force=True, detail="covered in its mount namespace: " + (", ".join(covered) or "none")
                 + (f"; not present here: {', '.join(absent)}" if absent else ""))
