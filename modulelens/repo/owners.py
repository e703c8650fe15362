"""Which process owns something, and whether that process is still alive.

An owner is ``"<pid>.<start>"``: the process id and, on Linux, its start time in clock ticks
since boot (``/proc/<pid>/stat`` field 22), so a reused pid is not mistaken for the owner.
Elsewhere the start is ``0`` and only the pid is checked.

Used for the repository's temporary folders (a folder whose owner died is stale) and by worker
processes that must not publish once their caller died.
"""

from __future__ import annotations

import os
from pathlib import Path


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` (``"0"`` where /proc is unavailable); None when it is not running."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():
        try:
            text = stat.read_text()
        except OSError:
            return None
        fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 3
        return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "0"


def owner_of(pid: int) -> str:
    """The owner string of the running process ``pid``."""
    return f"{pid}.{_start_time(pid) or '0'}"


def this_process() -> str:
    return owner_of(os.getpid())


def owner_alive(owner: str) -> bool:
    """True when the process that ``owner`` names still runs (a malformed owner counts as alive:
    only what is known to be dead is treated as stale)."""
    pid_text, _, start = owner.partition(".")
    if not pid_text.isdigit():
        return True
    now = _start_time(int(pid_text))
    return now is not None and (start in ("", "0") or now == start or now == "0")
