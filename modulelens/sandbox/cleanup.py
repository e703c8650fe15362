"""Removing folders a candidate wrote into, whatever it left there.

:func:`remove_tree` is iterative (no recursion, so no depth stops it: a 100 000-deep chain of
folders is removed like a flat one), holds one directory descriptor at a time (no descriptor
limit stops it), never follows a symbolic link (every step is ``openat``/``unlinkat`` relative to
the descriptor of the folder being emptied, with ``O_NOFOLLOW``), never needs a path longer than
one name (no ``ENAMETOOLONG``), and gives itself the permissions it needs on the way (a folder
made unreadable or unwritable is ``chmod``-ed back first). Coming back up it opens ``..`` and
checks that it is the folder it came from (device and inode), so a folder moved while it works
can make it stop, never make it remove anything outside the tree.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _open_dir(name: str, parent: int) -> int | None:
    """Open the folder ``name`` in ``parent`` without following links; None when it is not a folder."""
    for attempt in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except PermissionError:
            if attempt:
                raise
            os.chmod(name, 0o700, dir_fd=parent, follow_symlinks=False)
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENOENT):
                return None
            raise
    return None


def _remove_entry(name: str, parent: int) -> bool:
    """Remove ``name`` from ``parent`` if it is not a non-empty folder; False when it is one."""
    for attempt in range(2):
        try:
            os.unlink(name, dir_fd=parent)
            return True
        except FileNotFoundError:
            return True
        except IsADirectoryError:
            break
        except PermissionError:
            if attempt:
                raise
            os.fchmod(parent, 0o700)
        except OSError as e:
            if e.errno != errno.EISDIR:
                raise
            break
    try:
        os.rmdir(name, dir_fd=parent)
        return True
    except FileNotFoundError:
        return True
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        if e.errno in (errno.EACCES, errno.EPERM):
            os.fchmod(parent, 0o700)
            os.rmdir(name, dir_fd=parent)
            return True
        raise


def remove_tree(path: Path) -> bool:
    """Remove ``path`` and everything under it (see the module docstring). A symbolic link at
    ``path`` is removed, not followed. Returns whether ``path`` is gone; never raises for what the
    tree holds (an error that stops it -- a folder moved under it -- leaves the rest and says False)."""
    path = Path(path)
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            try:
                path.unlink()
            except OSError:
                return False
            return True
        return e.errno == errno.ENOENT
    fd, above = top, [_identity(top)]
    try:
        while True:
            child, removed = None, 0
            with os.scandir(fd) as entries:
                names = [e.name for e in entries]
            for name in names:
                if _remove_entry(name, fd):
                    removed += 1
                    continue
                child = _open_dir(name, fd)
                if child is not None:
                    break
            if child is None and names and not removed:
                return False  # entries that are neither removable nor enterable: changing under it
            if child is not None:
                os.close(fd)
                fd = child
                above.append(_identity(fd))
                continue
            if len(above) == 1:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            above.pop()
            if _identity(fd) != above[-1]:
                return False  # moved while being removed: stop rather than follow it anywhere
        os.close(fd)
        fd = -1
        os.rmdir(path)
        return True
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
