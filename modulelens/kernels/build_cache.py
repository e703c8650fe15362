"""The build cache shared by the compiled backends (cpp, cuda).

* the build folder (``$MODULELENS_BUILD_DIR``, else ``$XDG_CACHE_HOME/modulelens/build``), one
  sub-folder per build named from a hash of everything that changes the binary (:func:`source_key`);
* the extensions this process has loaded, by build name (a name is loaded at most once);
* one process-wide lock: builds redirect the process's file descriptors 1 and 2, so they run one
  at a time;
* remembered failures: a build that failed in the candidate's own source leaves
  ``compile_error.txt`` with the short message, so the same source is not compiled again.

Candidates are built inside their sandbox in a folder of their own; the *shared* build cache
(``<build folder>/published``, :func:`publish_dir`) only takes finished builds, published by the
checker (:func:`publish_build`) and read-only to candidate processes, which load a published build
only when its checksum matches (:func:`published_build`). What the checker publishes, and where:

* the **address** is computed by the checker from what it knows of the candidate -- its source,
  entry point, the compile flags and the environment (the backend's ``build_name`` for card
  candidates, :func:`modulelens.kernels.module_builds.module_build_address` for the extensions a
  module candidate builds with ``load_inline``) -- never a name or path the candidate reports;
* the **file** is found from the candidate's scratch folder by opening each step relative to the
  previous folder's descriptor with ``O_NOFOLLOW`` (a link anywhere on the way is refused), must be
  a regular file holding an ELF shared object of a sane size, and is copied from that descriptor
  (nothing swapped after the check is read); its sha256 is of the bytes copied;
* it must be **the inode the candidate's process mapped** (:func:`read_loaded_build`): the kernel's
  ``/proc/PID/maps`` of that process names the same file, not `` (deleted)``, with the same device
  and inode as the descriptor read, every mapped range within the file's size and inside one of
  the loadable segments of the bytes read. A build its static initialiser deleted, replaced or
  truncated after it was loaded is never published.

A candidate can therefore put in the cache only the build of its own source, under its own
address: it cannot replace another kernel's entry, nor make the checker copy any other file.
Not seen from outside: a rewrite *in place* (same inode) that keeps the segment layout; the pages
the checks then ran are those the page cache holds, i.e. the rewritten bytes published.

An entry is verified before every use (its sha256 against the bytes, :func:`published_build`;
:func:`published_mismatch` says why not), and an entry that fails is replaced by the next verified
build of the same address (:func:`publish_build`), never trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

FAILED = "compile_error.txt"
BUILD_LOG = "build.log"
STALE_LOCK_S = 900  # a torch build lock older than this was left by a killed build

PUBLISHED = "published"
MAX_LIBRARY_BYTES = 1 << 30
BUILD_LOCK = threading.RLock()
_LOADED: dict[str, Any] = {}
_SHARED: list[Path] = []
_BUILDS: list[tuple[str, str, bool]] = []
CHECKSUM = "sha256"


def default_build_dir() -> Path:
    """The build folder (created if missing)."""
    base = Path(os.environ.get("MODULELENS_BUILD_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                / "modulelens" / "build")
    base.mkdir(parents=True, exist_ok=True)
    return base


def torch_location() -> str:
    """The folder torch is installed in. A build's ninja file names torch's headers and libraries
    by this path, so builds against another installation (another virtual environment, a clean
    clone's) go in folders of their own: sharing one made ninja rebuild it each time the other
    installation loaded it."""
    import torch

    return os.path.dirname(os.path.realpath(torch.__file__))


def source_key(*parts: str) -> str:
    """sha256 of the parts that decide a build's output."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def loaded(name: str) -> Any | None:
    """The extension module built as ``name`` in this process, if any."""
    return _LOADED.get(name)


def remember_loaded(name: str, module: Any) -> None:
    _LOADED[name] = module


def previous_failure(folder: Path) -> tuple[str, str] | None:
    """(short message, full log) of an earlier failed build of the same source, or None."""
    failed = folder / FAILED
    if not failed.exists():
        return None
    return failed.read_text(), read_log(folder)


def read_log(folder: Path) -> str:
    try:
        return (folder / BUILD_LOG).read_text()
    except OSError:
        return ""


def remember_failure(folder: Path, message: str, log: str) -> None:
    """Keep the log; remember the failure when the errors are in the candidate's own source (so the
    same source is not compiled again), not when the environment failed (compiler missing, ...)."""
    with contextlib.suppress(OSError):
        (folder / BUILD_LOG).write_text(log)
        if "<source>:" in message or "<bindings>" in message:
            (folder / FAILED).write_text(message)


def clear_stale_lock(folder: Path) -> None:
    """torch's FileBaton waits forever on a ``lock`` file left by a build that was killed."""
    lock = folder / "lock"
    with contextlib.suppress(OSError):
        if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink()


def publish_dir(build_dir: Path) -> Path:
    """The shared cache of verified builds inside the build folder ``build_dir``."""
    return Path(build_dir) / PUBLISHED


def use_shared_builds(folder: Path) -> None:
    """Load finished builds from the shared cache of the build folder ``folder`` when their checksum matches."""
    _SHARED[:] = [publish_dir(folder)]


def published_build(address: str, filename: str, shared: Path | None = None) -> Path | None:
    """The shared cache's build at ``address`` (its file ``filename``) if one is published and its
    sha256 matches, else None. ``shared``: the build folder whose cache to look in (default: the
    one :func:`use_shared_builds` named)."""
    for folder in ([publish_dir(shared)] if shared is not None else _SHARED):
        lib = folder / address / filename
        try:
            want = (folder / address / CHECKSUM).read_text().strip()
            if hashlib.sha256(lib.read_bytes()).hexdigest() == want:
                return lib
        except OSError:
            continue
    return None


def remember_build(name: str, library: Path, fresh: bool) -> None:
    """Note an extension this process loaded: built here (``fresh``: the checker may publish it)
    or taken from the shared cache."""
    _BUILDS.append((name, str(library), fresh))


def builds_in_process() -> list[tuple[str, str, bool]]:
    """(name, library path, fresh) of every extension this process loaded, in order."""
    return list(_BUILDS)


def _open_below(root: Path, parts: list[str]) -> int:
    """A read-only descriptor of ``root/parts...``, each step opened relative to the last without
    following links. Raises OSError (ELOOP for a link)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            if "/" in part or part in ("", ".", ".."):
                raise OSError(22, f"not a plain name: {part!r}")
            last = i == len(parts) - 1
            nxt = os.open(part, flags | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_build(root: Path, parts: list[str]) -> bytes:
    """The bytes of the built library at ``root/parts...`` (see the module docstring: no link
    followed, a regular file, an ELF shared object). Raises ValueError saying why not."""
    return _read_checked(root, parts, None)


def read_loaded_build(root: Path, parts: list[str], maps_text: str) -> bytes:
    """The bytes of the built library at ``root/parts...`` as :func:`read_build` reads them, and
    only when they are the very file mapped in the process whose ``/proc/PID/maps`` is
    ``maps_text`` (:func:`mapping_problem`), still so after reading. Raises ValueError saying why not."""
    return _read_checked(root, parts, maps_text)


def _read_checked(root: Path, parts: list[str], maps_text: str | None) -> bytes:
    import stat

    shown = "/".join(parts)
    try:
        fd = _open_below(root, parts)
    except OSError as e:
        raise ValueError(f"{shown} cannot be opened without following links ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{shown} is not a regular file")
        if st.st_size > MAX_LIBRARY_BYTES:
            raise ValueError(f"{shown} is {st.st_size} bytes, over the {MAX_LIBRARY_BYTES} allowed")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_LIBRARY_BYTES:
                raise ValueError(f"{shown} grew past {MAX_LIBRARY_BYTES} bytes while read")
        data = b"".join(chunks)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if len(data) < 64 or data[:4] != b"\x7fELF" or int.from_bytes(data[16:18], "little" if data[5] == 1 else "big") != 3:
        raise ValueError(f"{shown} is not an ELF shared object")
    if maps_text is not None:
        if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (st.st_size, st.st_mtime_ns, st.st_ctime_ns) \
                or len(data) != st.st_size:
            raise ValueError(f"{shown} changed while the checker read it")
        problem = mapping_problem(maps_text, os.path.join(os.path.realpath(root), *parts), st, data)
        if problem:
            raise ValueError(problem)
    return data


def _mappings_of(maps_text: str, path: str) -> list[tuple[int, int, str, int, str, int, bool]]:
    """(start, end, permissions, offset, device, inode, deleted) of each mapping of ``path`` in a
    ``/proc/PID/maps`` text (the kernel marks a file unlinked since with `` (deleted)``)."""
    found = []
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) != 6:
            continue
        name = fields[5]
        deleted = name.endswith(" (deleted)")
        if name.removesuffix(" (deleted)") != path:
            continue
        start, _, end = fields[0].partition("-")
        try:
            found.append((int(start, 16), int(end, 16), fields[1], int(fields[2], 16), fields[3], int(fields[4]),
                          deleted))
        except ValueError:
            continue
    return found


def _load_ranges(data: bytes) -> list[tuple[int, int]] | None:
    """File ranges ``[offset, end)`` of the loadable segments of the ELF ``data``, page-aligned as
    the dynamic linker maps them; None for a layout this does not read (not 64-bit little-endian)."""
    if data[4] != 2 or data[5] != 1:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize, phnum = int.from_bytes(data[0x36:0x38], "little"), int.from_bytes(data[0x38:0x3A], "little")
    ranges = []
    for i in range(phnum):
        ph = data[phoff + i * phentsize: phoff + (i + 1) * phentsize]
        if len(ph) < 56:
            return []
        if int.from_bytes(ph[0:4], "little") != 1:  # PT_LOAD
            continue
        offset, filesz = int.from_bytes(ph[8:16], "little"), int.from_bytes(ph[32:40], "little")
        ranges.append((offset - offset % page, -(-(offset + filesz) // page) * page))
    return ranges


def mapping_problem(maps_text: str, path: str, st: os.stat_result, data: bytes) -> str:
    """Why the file ``path`` -- opened by the checker, ``st`` the descriptor's status and ``data``
    the bytes read from it -- is not what is mapped at that path in the process whose
    ``/proc/PID/maps`` is ``maps_text`` ('' when it is): no mapping of it, a mapping of a file
    deleted or replaced since, another device or inode (the device is compared where the file's
    own is a real one: overlayfs and btrfs report an anonymous device to ``stat``), a mapped range
    past the end of the file (truncated after loading), or one outside every loadable segment of
    the bytes read (rewritten with another layout)."""
    name = os.path.basename(path)
    if not maps_text:
        return f"{name}: the candidate's memory map could not be read, so the file cannot be matched to what it loaded"
    mapped = _mappings_of(maps_text, path)
    if not mapped:
        return f"{name} is not mapped in the candidate's process (it loaded another file)"
    if any(m[6] for m in mapped):
        return f"{name} was deleted or replaced after it was loaded"
    page = os.sysconf("SC_PAGE_SIZE")
    end_of_file = -(-st.st_size // page) * page
    ranges = _load_ranges(data)
    for start, end, perms, offset, device, inode, _ in mapped:
        major, _, minor = device.partition(":")
        same_device = os.major(st.st_dev) == 0 or (int(major, 16), int(minor or "0", 16)) == (
            os.major(st.st_dev), os.minor(st.st_dev))
        if inode != st.st_ino or not same_device:
            return f"{name} was replaced after it was loaded (mapped inode {device} {inode}, on disk now " \
                   f"{os.major(st.st_dev):x}:{os.minor(st.st_dev):02x} {st.st_ino})"
        if offset + (end - start) > end_of_file:
            return f"{name} was truncated after it was loaded (mapped up to byte {offset + end - start}, " \
                   f"{st.st_size} bytes now)"
        if ranges is not None and perms[:3] != "---" and not any(
                lo <= offset and offset + (end - start) <= hi for lo, hi in ranges):
            return f"{name} was rewritten after it was loaded (a mapped range at offset {offset:#x} is in no " \
                   "loadable segment of the file now)"
    return ""


def published_mismatch(shared: Path, address: str, filename: str) -> str:
    """Why the shared cache's entry at ``address`` (in the build folder ``shared``) does not hold
    the build its recorded sha256 names: '' when it does, or when there is no entry at all."""
    entry = publish_dir(shared) / address
    if not entry.exists():
        return ""
    try:
        want = (entry / CHECKSUM).read_text().strip()
    except OSError:
        return f"the shared cache's entry {address} has no checksum (an interrupted publication)"
    try:
        got = hashlib.sha256((entry / filename).read_bytes()).hexdigest()
    except OSError as e:
        return f"the shared cache's build {address}/{filename} cannot be read ({e.strerror})"
    if got != want:
        return (f"the shared cache's build {address}/{filename} does not match the sha256 recorded when it was "
                f"published ({got[:12]}... instead of {want[:12]}...)")
    return ""


def publish_build(shared: Path, address: str, data: bytes, filename: str) -> Path | None:
    """Store ``data`` (verified by :func:`read_loaded_build`) as ``filename`` at ``address`` in the
    shared cache of the build folder ``shared``, with its sha256, atomically; an existing entry is
    kept when it verifies (:func:`published_mismatch`), replaced otherwise. Returns the published
    file, or None when it could not be written."""
    import shutil

    root = publish_dir(shared)
    target = root / address
    if not (address.replace("_", "").isalnum() and filename.replace("_", "").replace(".", "").isalnum()):
        return None
    if (target / CHECKSUM).exists() and not published_mismatch(shared, address, filename):
        return target / filename
    tmp = root / f".{address}.{os.getpid()}.tmp"
    stale = root / f".{address}.{os.getpid()}.stale"
    try:
        tmp.mkdir(parents=True)
        (tmp / filename).write_bytes(data)
        (tmp / CHECKSUM).write_text(hashlib.sha256(data).hexdigest())
        if target.exists():  # an interrupted publication, or an entry that no longer verifies
            os.replace(target, stale)
        os.replace(tmp, target)
        return target / filename
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return target / filename if (target / CHECKSUM).exists() and not published_mismatch(
            shared, address, filename) else None
    finally:
        shutil.rmtree(stale, ignore_errors=True)

