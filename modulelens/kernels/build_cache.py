"""The build cache shared by the compiled backends (cpp, cuda).

* the build folder (``$MODULELENS_BUILD_DIR``, else ``$XDG_CACHE_HOME/modulelens/build``), one
  sub-folder per build named from a hash of everything that changes the binary (:func:`source_key`);
* the extensions this process has loaded, by build name (a name is loaded at most once);
* one process-wide lock: builds redirect the process's file descriptors 1 and 2, so they run one
  at a time;
* remembered failures: a build that failed in the candidate's own source leaves
  ``compile_error.txt`` with the short message, so the same source is not compiled again.

Candidates are built inside their sandbox in a folder of their own; the *shared* build cache only
takes finished builds, published by the checker (:func:`publish_build`: the extension file and
its sha256, written atomically) and read-only to candidate processes, which load a published
build only when its checksum matches (:func:`published_build`). A file planted in a candidate's
own folder therefore never reaches another candidate's build.
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


def use_shared_builds(folder: Path) -> None:
    """Load finished builds from ``folder`` (the shared cache) when their checksum matches."""
    _SHARED[:] = [folder]


def published_build(name: str, suffix: str) -> Path | None:
    """The shared cache's build of ``name`` (``<name><suffix>``) if one is published and its sha256
    matches, else None."""
    for folder in _SHARED:
        lib = folder / name / f"{name}{suffix}"
        try:
            want = (folder / name / CHECKSUM).read_text().strip()
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


def publish_build(shared: Path, name: str, library: Path) -> bool:
    """Copy a finished build into the shared cache as ``<shared>/<name>/`` (library, then its
    sha256), atomically; an existing entry is kept. Returns whether it was published."""
    target = shared / name
    if (target / CHECKSUM).exists() or not library.is_file() or not name.replace("_", "").isalnum():
        return False
    tmp = shared / f".{name}.{os.getpid()}.tmp"
    try:
        tmp.mkdir(parents=True)
        data = library.read_bytes()
        (tmp / library.name).write_bytes(data)
        (tmp / CHECKSUM).write_text(hashlib.sha256(data).hexdigest())
        if target.exists():  # a folder without checksum: an old-style or interrupted build
            import shutil

            shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        return True
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        return False
