"""The build cache shared by the compiled backends (cpp, cuda).

* the build folder (``$MODULELENS_BUILD_DIR``, else ``$XDG_CACHE_HOME/modulelens/build``), one
  sub-folder per build named from a hash of everything that changes the binary (:func:`source_key`);
* the extensions this process has loaded, by build name (a name is loaded at most once);
* one process-wide lock: builds redirect the process's file descriptors 1 and 2, so they run one
  at a time;
* remembered failures: a build that failed in the candidate's own source leaves
  ``compile_error.txt`` with the short message, so the same source is not compiled again.
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
