# Escape: reach the template it was forked from, or a sibling candidate running at the same time:
# signal it, attach to it, read its memory and its /proc entries. The pids are given (in the
# checker's PID namespace). It reports what it got; the test checks that they still run.
import ctypes
import errno
import os
import signal

libc = ctypes.CDLL(None, use_errno=True)
seen = []


def note(name, fn, *args):
    try:
        fn(*args)
        seen.append(f"{name}=ok")
    except OSError as e:
        seen.append(f"{name}={errno.errorcode.get(e.errno, e.errno)}")


def read(path):
    with open(path, "rb") as f:
        f.read(64)


def ptrace(pid):
    if libc.ptrace(16, pid, 0, 0) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")


for who, pid in (("template", int("__TEMPLATE__")), ("sibling", int("__SIBLING__"))):
    note(f"{who}-signal", os.kill, pid, signal.SIGKILL)
    note(f"{who}-ptrace", ptrace, pid)
    for entry in ("mem", "maps", "environ"):
        note(f"{who}-{entry}", read, f"/proc/{pid}/{entry}")
    note(f"{who}-pgroup", os.killpg, pid, signal.SIGKILL)

raise RuntimeError("reach " + " ".join(seen))
