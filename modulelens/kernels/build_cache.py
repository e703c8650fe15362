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
  (nothing swapped after the check is read); its sha256 is of the bytes copied.

A candidate can therefore put in the cache only the build of its own source, under its own
address: it cannot replace another kernel's entry, nor make the checker copy any other file.
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
    import stat

    try:
        fd = _open_below(root, parts)
    except OSError as e:
        raise ValueError(f"{'/'.join(parts)} cannot be opened without following links ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{'/'.join(parts)} is not a regular file")
        if st.st_size > MAX_LIBRARY_BYTES:
            raise ValueError(f"{'/'.join(parts)} is {st.st_size} bytes, over the {MAX_LIBRARY_BYTES} allowed")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_LIBRARY_BYTES:
                raise ValueError(f"{'/'.join(parts)} grew past {MAX_LIBRARY_BYTES} bytes while read")
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) < 64 or data[:4] != b"\x7fELF" or int.from_bytes(data[16:18], "little" if data[5] == 1 else "big") != 3:
        raise ValueError(f"{'/'.join(parts)} is not an ELF shared object")
    return data


def publish_build(shared: Path, address: str, data: bytes, filename: str) -> Path | None:
    """Store ``data`` (verified by :func:`read_build`) as ``filename`` at ``address`` in the shared
    cache of the build folder ``shared``, with its sha256, atomically; an existing entry is kept.
    Returns the published file, or None when it could not be written."""
    import shutil

    root = publish_dir(shared)
    target = root / address
    if not (address.replace("_", "").isalnum() and filename.replace("_", "").replace(".", "").isalnum()):
        return None
    if (target / CHECKSUM).exists():
        return target / filename
    tmp = root / f".{address}.{os.getpid()}.tmp"
    try:
        tmp.mkdir(parents=True)
        (tmp / filename).write_bytes(data)
        (tmp / CHECKSUM).write_text(hashlib.sha256(data).hexdigest())
        if target.exists():  # a folder without checksum: an interrupted publication
            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        return target / filename
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return target / filename if (target / CHECKSUM).exists() else None

