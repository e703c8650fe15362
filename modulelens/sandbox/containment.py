"""Containment of a candidate process on Linux, in layers; each layer says whether it is in force.

Layers, outermost first:

* **namespaces** (:func:`namespace_prefix`): the candidate process is started through the
  ``unshare`` binary in new user, PID, network, mount and IPC namespaces, as PID 1 of its PID
  namespace (``--fork --kill-child``): it sees no other process (``/proc`` is remounted), has no
  network but a loopback that is down, and when it dies -- or the ``unshare`` process in front of
  it is killed -- the kernel kills every process left in the namespace (a ``setsid`` grandchild
  included). Probed once per process; where ``unshare`` fails, the layer is reported absent and
  the process group is all that is killed.
* **private /tmp** (:func:`private_tmp`): a fresh tmpfs on ``/tmp`` inside the mount namespace.
* **rlimits** (:func:`apply_rlimits`): address space (CPU runs only: CUDA maps far more than it
  uses), processes/threads, core dumps off.
* **private /dev** (:func:`modulelens.sandbox.mounts.private_dev`): a tmpfs with only the
  harmless device nodes and its own ``/dev/shm``.
* **not dumpable** (:func:`not_dumpable`): ``PR_SET_DUMPABLE`` 0 -- no core dump, and its memory
  and ``/proc`` entries are closed to other processes of the same user (a sibling candidate),
  however they found it.
* **Landlock** (:func:`apply_landlock`): the process and everything it starts may write only in
  its scratch folder, the device files ``/dev/null``, ``zero``, ``full``, ``random``, ``urandom``
  (and the GPU's) and, with a private ``/dev``, its own ``/dev/shm``; read only system and Python install
  folders plus its scratch and the read-only build cache, open no TCP connection and bind no TCP
  port (ABI 4+), and signal no process and reach no abstract Unix socket outside itself (ABI 6+).
* **seccomp** (:func:`modulelens.sandbox.seccomp.apply_seccomp`, installed last): a deny list of
  system calls a kernel candidate never needs (ptrace, mount, namespaces, keyring, BPF, module
  loading, creating sockets of any family, ...) answers EPERM; x86_64 and aarch64 only, else
  reported absent.

The checker confines itself too (:func:`confine_checker`): Landlock limits what it reads to system
and Python folders, the task's input artifacts and the build cache, and what it writes to its
scratch, the candidates' scratch folders and the build cache's publish folder; it then checks that
the signing key and the repository's other contents are out of its reach by trying to open them.

:class:`Isolation` is what a candidate process reports about itself after applying the layers;
the checker adds what it observed from outside. Nothing here claims a layer it did not check.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

from pydantic import BaseModel, Field


class Layer(BaseModel):
    name: str
    in_force: bool
    detail: str = ""


class Isolation(BaseModel):
    """The containment layers of one candidate process, as they were actually in force."""

    layers: list[Layer] = Field(default_factory=list)

    def add(self, name: str, in_force: bool, detail: str = "") -> None:
        self.layers.append(Layer(name=name, in_force=in_force, detail=detail))

    def in_force(self) -> list[str]:
        return [x.name for x in self.layers if x.in_force]

    def summary(self) -> str:
        """'in force: a, b; not in force: c (why)'."""
        yes = ", ".join(self.in_force()) or "none"
        no = "; ".join(f"{x.name} ({x.detail})" if x.detail else x.name for x in self.layers if not x.in_force)
        return f"in force: {yes}" + (f"; not in force: {no}" if no else "")


# -- namespaces --------------------------------------------------------------------------------

_UNSHARE_FLAGS = (["--user", "--map-root-user"], ["--pid", "--fork", "--kill-child", "--mount-proc"], ["--net"],
                  ["--mount"], ["--ipc"])


@cache
def namespace_prefix() -> tuple[list[str], str]:
    """(command prefix that starts a program in new namespaces, description); ``[]`` and why not
    when ``unshare`` is missing or the kernel refuses. Tried with a user namespace first, then
    without (enough when running as root)."""
    if platform.system() != "Linux":
        return [], "not Linux"
    exe = shutil.which("unshare")
    if not exe:
        return [], "no unshare binary"
    why = ""
    for flags in (_UNSHARE_FLAGS, _UNSHARE_FLAGS[1:]):
        cmd = [exe, *[f for group in flags for f in group]]
        try:
            done = subprocess.run([*cmd, "true"], capture_output=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as e:
            why = str(e)
            continue
        if done.returncode == 0:
            kinds = "user, PID, network, mount, IPC" if "--user" in cmd else "PID, network, mount, IPC (no user namespace)"
            return cmd, kinds
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        why = why[0]
    return [], f"unshare refused: {why}"


# -- inside the candidate process ---------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True) if platform.system() == "Linux" else None
_MS_NOSUID, _MS_NODEV = 2, 4
USER_NAMESPACES_HINT = ("what to do: allow unprivileged user namespaces, e.g. sysctl kernel.unprivileged_userns_clone=1 "
                        "or kernel.apparmor_restrict_unprivileged_userns=0")


def private_tmp(needed: list[str]) -> Layer:
    """Mount a fresh tmpfs on /tmp (only meaningful inside a mount namespace: PID 1 there), then
    bind back in, at the same paths, the folders of ``needed`` (its scratch, the build cache,
    Python's installation, its import path) that lie under the host's /tmp: a build folder or a
    checkout in /tmp stays usable, and nothing else of the host's /tmp is visible. Each folder is
    held by a descriptor opened before the tmpfs covers it, so no path is looked up in the new
    tmpfs on the way; a folder that cannot be bound back leaves the host's /tmp as it was."""
    name = "private /tmp"
    if _libc is None or os.getpid() != 1:
        return Layer(name=name, in_force=False, detail=f"no mount namespace ({USER_NAMESPACES_HINT})")
    under = sorted({os.path.realpath(p) for p in needed if Path(os.path.realpath(p)).is_relative_to("/tmp")
                    and os.path.realpath(p) != "/tmp" and os.path.exists(p)})
    top = [p for p in under if not any(p != q and Path(p).is_relative_to(q) for q in under)]
    if "/tmp" in {os.path.realpath(p) for p in needed}:
        return Layer(name=name, in_force=False, detail="/tmp itself is a folder it needs")
    held: dict[str, int] = {}
    try:
        for path in top:
            held[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        if _libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1g,mode=1777") != 0:
            return Layer(name=name, in_force=False, detail=os.strerror(ctypes.get_errno()))
        for path, fd in held.items():
            why = _bind_back(path, fd)
            if why:
                _libc.umount2(b"/tmp", _MNT_DETACH)
                return Layer(name=name, in_force=False, detail=f"binding {path} back in: {why}")
    except OSError as e:
        return Layer(name=name, in_force=False, detail=f"{e.strerror}: {e.filename}")
    finally:
        for fd in held.values():
            os.close(fd)
    return Layer(name=name, in_force=True, detail="its own tmpfs" + (
        f"; bound in from the host's /tmp: {', '.join(top)}" if top else ""))


_MS_BIND, _MS_REC, _MNT_DETACH = 4096, 16384, 2


def _bind_back(path: str, fd: int) -> str:
    """Bind the folder (or file) held by ``fd`` onto ``path`` in the fresh tmpfs on /tmp; why not, or ''."""
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        os.makedirs(path, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        Path(path).touch(mode=0o644)
    if _libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, _MS_BIND | _MS_REC, None) != 0:
        return os.strerror(ctypes.get_errno())
    return ""


def apply_rlimits(memory_mb: int, limit_address_space: bool, max_processes: int = 512) -> Layer:
    """Core dumps off; processes/threads capped; address space capped (CPU runs only)."""
    parts = []
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
        parts.append(f"{max_processes} processes")
    except (ValueError, OSError):
        pass
    if limit_address_space and memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        parts.append(f"{memory_mb} MiB address space")
    else:
        parts.append("no address-space cap (GPU run)")
    return Layer(name="rlimits", in_force=True, detail=", ".join(parts))


# Landlock (see linux/landlock.h)
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_ALL_V1 = (1 << 13) - 1
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
# system files a compiler and the dynamic linker read in /etc (the rest of /etc stays closed)
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime",
              "/etc/nsswitch.conf")


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: unavailable)."""
    if _libc is None:
        return 0
    v = _libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(v), 0)


def readable_roots(extra: list[str]) -> list[str]:
    """Folders the candidate may read (and execute from): system folders, Python's installation
    and import path, and ``extra``."""
    roots = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/opt", "/proc", "/sys",
             sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parents[2]), *extra]
    roots += [p for p in sys.path if p and os.path.isdir(p)]
    return sorted({os.path.realpath(p) for p in roots})


DEVICES = ("null", "zero", "full", "random", "urandom")


def gpu_nodes() -> list[str]:
    """The NVIDIA device nodes of this machine (what CUDA opens)."""
    import glob
    import stat

    found = []
    for path in sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*")):
        try:
            if stat.S_ISCHR(os.stat(path).st_mode):
                found.append(path)
        except OSError:
            continue
    return found


def device_files() -> list[str]:
    """The device files a process outside a private /dev may read and write (and GPU nodes)."""
    return [f"/dev/{d}" for d in DEVICES] + gpu_nodes()


def apply_landlock(writable: list[str], readable: list[str], private_dev: bool = False, *,
                   scope_signals: bool = True, what: str = "writes only in scratch") -> Layer:
    """Restrict this process (and all it starts) to writing only under ``writable`` and reading only
    under ``readable`` (plus a few files in /etc and the device files: all of a ``private_dev``,
    else :func:`device_files`); no TCP (ABI 4+); no abstract Unix sockets and, with
    ``scope_signals``, no signals out of its domain (ABI 6+)."""
    abi = landlock_abi()
    if abi < 1:
        return Layer(name="landlock", in_force=False, detail="not supported by this kernel")
    fs_all = _FS_ALL_V1 | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0) | (_IOCTL_DEV if abi >= 5 else 0)
    fields: list[int] = [fs_all]
    if abi >= 4:
        fields.append(_NET_BIND_TCP | _NET_CONNECT_TCP)
    if abi >= 6:
        fields.append(_SCOPE_ABSTRACT_UNIX | (_SCOPE_SIGNAL if scope_signals else 0))
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    fd = _libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return Layer(name="landlock", in_force=False, detail=f"create_ruleset: {os.strerror(ctypes.get_errno())}")
    read = _EXECUTE | _READ_FILE | _READ_DIR
    device = read | _WRITE_FILE | _TRUNCATE | (_IOCTL_DEV if abi >= 5 else 0)
    try:
        for path in readable:
            _allow(fd, path, read, fs_all)
        for path in _ETC_FILES:
            _allow(fd, path, read, fs_all)
        for path in device_files():  # the nodes themselves (a private /dev holds only these)
            _allow(fd, path, device, fs_all)
        if private_dev:  # its own /dev/shm; /dev itself only listed (no file made next to the nodes)
            _allow(fd, "/dev/shm", fs_all, fs_all)
            _allow(fd, "/dev", _READ_DIR, fs_all)
        for path in writable:
            _allow(fd, path, fs_all, fs_all)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return Layer(name="landlock", in_force=False, detail="no_new_privs refused")
        if _libc.syscall(_SYS_RESTRICT, fd, ctypes.c_uint32(0)) != 0:
            return Layer(name="landlock", in_force=False, detail=f"restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
    nodes = [p.removeprefix("/dev/") for p in device_files()]
    parts = [what, "reads only system and Python folders",
             "devices: " + ", ".join(nodes) + (" and its own /dev/shm" if private_dev else "")]
    if abi >= 4:
        parts.append("no TCP")
    if abi >= 6:
        parts.append("no abstract Unix sockets outside" + (", no signals outside" if scope_signals else ""))
    return Layer(name="landlock", in_force=True, detail=f"ABI {abi}: " + ", ".join(parts))


def hand_over_maps(channel: int, also: list[int] = ()) -> None:
    """(In a candidate process, before any candidate code) send the checker, over the Unix socket
    ``channel``, a descriptor of this process's ``/proc/self/maps``: once the process is not
    dumpable, the checker may not open it by path (unless it holds CAP_SYS_PTRACE), but reads
    through a descriptor opened by the process itself keep working. One byte, the maps
    descriptor first, then ``also`` (the sampling events of :mod:`modulelens.validation.sampling`)."""
    import array
    import socket

    try:
        fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        sock = socket.socket(fileno=os.dup(channel))
        try:
            sock.sendmsg([b"m"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd, *also]))])
        finally:
            sock.close()
    except OSError:
        pass
    finally:
        os.close(fd)


_PR_SET_DUMPABLE = 4


def not_dumpable() -> Layer:
    """``PR_SET_DUMPABLE`` 0: no core dump, and other processes of the same user (not holding
    CAP_SYS_PTRACE over it) can neither read its memory nor its ``/proc`` entries."""
    if _libc is None:
        return Layer(name="not dumpable", in_force=False, detail="not Linux")
    if _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return Layer(name="not dumpable", in_force=False, detail=os.strerror(ctypes.get_errno()))
    return Layer(name="not dumpable", in_force=True, detail="no core dump; memory and /proc closed to its user's "
                 "other processes")


def _allow(ruleset: int, path: str, access: int, handled: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a folder that does not exist needs no rule
    try:
        if not os.path.isdir(path):
            access &= _FILE_RIGHTS
        rule = _PathBeneath(allowed_access=access & handled, parent_fd=fd)
        if _libc.syscall(_SYS_ADD_RULE, ruleset, ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def paths_beneath_except(roots: list[str], denied: list[str]) -> list[str]:
    """Paths whose hierarchies together hold everything under ``roots`` but nothing under
    ``denied``: a root holding no denied path as itself; otherwise, along the way down to each
    denied path, every other entry (symbolic links skipped: their targets are reached as
    themselves, or not at all). Pure but for listing folders."""
    deny = {os.path.realpath(d) for d in denied}

    def holds_denied(path: str) -> bool:
        return any(d == path or d.startswith(path.rstrip("/") + "/") for d in deny)

    out: list[str] = []

    def expand(path: str) -> None:
        if path in deny:
            return
        if not holds_denied(path):
            out.append(path)
            return
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if not entry.is_symlink():
                expand(entry.path)

    for root in sorted({os.path.realpath(r) for r in roots}):
        if not any(root == d or root.startswith(d.rstrip("/") + "/") for d in deny):
            expand(root)
    return out


def restrict_reading(readable: list[str], denied: list[str]) -> Layer:
    """A further Landlock layer on this process (layers only ever narrow): read and execute only
    under ``readable`` minus the hierarchies ``denied`` (:func:`paths_beneath_except`); writing is
    left as the earlier layers set it."""
    abi = landlock_abi()
    name = "landlock (denial)"
    if abi < 1:
        return Layer(name=name, in_force=False, detail="not supported by this kernel")
    handled = _EXECUTE | _READ_FILE | _READ_DIR
    attr = ctypes.c_uint64(handled)
    fd = _libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if fd < 0:
        return Layer(name=name, in_force=False, detail=f"create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        paths = paths_beneath_except(readable, denied)
        for path in paths:
            _allow(fd, path, handled, handled)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return Layer(name=name, in_force=False, detail="no_new_privs refused")
        if _libc.syscall(_SYS_RESTRICT, fd, ctypes.c_uint32(0)) != 0:
            return Layer(name=name, in_force=False, detail=f"restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
    return Layer(name=name, in_force=True, detail=f"{len(denied)} hierarchies unreadable ({len(paths)} rules)")


# -- what the checker reads and reports from outside ----------------------------------------------

FOREIGN_LIBRARIES = ("numpy", "scipy", "numba", "llvmlite", "jax", "jaxlib", "tensorflow", "cupy", "sklearn",
                     "numexpr", "mlx")


def foreign_in(files: set[str] | list[str]) -> list[str]:
    """Of mapped ``files``, those of installed foreign numerical libraries (:data:`FOREIGN_LIBRARIES`,
    found by the package folder under ``site-packages``/``dist-packages``), as ``name (file, ...)``
    per library, sorted."""
    found: dict[str, set[str]] = {}
    for path in files:
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in path:
                top = path.split(marker, 1)[1].split("/", 1)[0].removesuffix(".libs")
                if top in FOREIGN_LIBRARIES:
                    found.setdefault(top, set()).add(os.path.basename(path))
                break
    return [f"{name} ({', '.join(sorted(names)[:3])}{', ...' if len(names) > 3 else ''})"
            for name, names in sorted(found.items())]


MASKED = "secrets masked"  # the candidate's layer: the secrets covered in its mount namespace


def secrets_layer(isolation: Isolation, read_only: list[Path], secrets: dict[str, Path],
                  masked: list[Path] = ()) -> Layer:
    """Whether the candidate can read ``secrets`` (what -> path: this machine's signing key folder,
    the repository with its reference outputs). A secret is out of its reach when it is one of
    ``masked`` and the candidate's :data:`MASKED` layer is in force (covered in its own mount
    namespace, whatever it may read), or when Landlock is in force and the secret lies under no
    folder the candidate may read (:func:`readable_roots`, computed here by the same rule the
    candidate process applies), or when it lies in the host's /tmp and a private /tmp is in force
    (which binds back only those folders). Otherwise the detail says what the user can do."""
    name = "signing key and repository unreadable"
    layers = {x.name: x.in_force for x in isolation.layers}
    hidden = {os.path.realpath(p) for p in masked} if layers.get(MASKED) else set()
    roots = readable_roots([str(p) for p in read_only])
    exposed, how = [], []
    for what, path in secrets.items():
        real = Path(os.path.realpath(path))
        under = [r for r in roots if real.is_relative_to(r)]
        if str(real) in hidden:
            how.append(f"{what} {real} masked in its mount namespace")
        elif not under and layers.get("landlock"):
            how.append(f"{what} {real} outside the folders Landlock lets it read")
        elif not under and layers.get("private /tmp") and real.is_relative_to("/tmp"):
            how.append(f"{what} {real} hidden by its private /tmp")
        elif under:
            exposed.append(f"{what} {real} lies under the readable {under[0]}")
        else:
            exposed.append(f"{what} {real}: no Landlock to keep it out")
    if exposed:
        fix = USER_NAMESPACES_HINT + " (they are then masked)" if not layers.get(MASKED) else (
            "what to do: keep the repository (--repo, MODULELENS_HOME) and the signing key (MODULELENS_CONFIG_DIR) "
            "outside the folders a candidate may read")
        return Layer(name=name, in_force=False, detail="; ".join(exposed) + f" ({fix})")
    return Layer(name=name, in_force=True, detail="; ".join(how))


# -- the checker's own layers ----------------------------------------------------------------------

CHECKER = "checker: "


def confine_checker(readable: list[str], writable: list[str], secrets: dict[str, str]) -> list[Layer]:
    """Confine the checker process (a sandbox worker's task) before it touches anything a candidate
    controls: no core dumps and not dumpable; Landlock reads only system and Python folders and
    ``readable`` (the task's input artifacts, the build cache), writes only ``writable`` (its
    scratch, the candidates' scratch folders, the build cache's publish folder), no TCP, no
    abstract Unix sockets (signals stay: it stops and kills its candidates). Then it proves that
    each of ``secrets`` (what -> path: the signing key file, the repository root) is out of reach
    by trying to open it. Returns the layers, each named ``checker: ...``."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    layers = [not_dumpable()]
    # folders it reads besides those it was given (system, Python, import path) never include a
    # secret: a project folder on the import path holding the repository is read without it
    implied = [r for r in readable_roots([]) if r not in {os.path.realpath(p) for p in readable}]
    roots = sorted({*paths_beneath_except(implied, list(secrets.values())), *map(os.path.realpath, readable)})
    layers.append(apply_landlock(writable, roots, scope_signals=False,
                                 what="writes only in its scratch, candidate scratch and the build cache's publish "
                                      "folder"))
    layers.append(_unreachable(secrets))
    for layer in layers:
        layer.name = CHECKER + layer.name
    return layers


def _unreachable(secrets: dict[str, str]) -> Layer:
    """Tries to open each secret (a file is opened, a folder listed): in force when every attempt
    was refused."""
    name = "signing key and repository unreadable"
    reached, refused = [], []
    for what, path in secrets.items():
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            reached.append(f"{what} {path}")
        except PermissionError:
            refused.append(f"{what} {path}")
        except OSError as e:
            refused.append(f"{what} {path} ({e.strerror})")
    if reached:
        return Layer(name=name, in_force=False, detail="the checker could open " + " and ".join(reached))
    return Layer(name=name, in_force=True, detail="opening " + " and ".join(refused) + " was refused")
