"""The seccomp layer of a candidate process: a classic-BPF system-call filter, built and installed with ctypes.

A deny list, not an allow list: candidates compile (g++, nvcc and ninja run as children, which
inherit the filter), so fork/exec/clone keep working and every call not named here is allowed.
What the filter does, per system call (``seccomp_data``: ``nr`` at offset 0, ``arch`` at 4, the
arguments at 16 + 8 i, little-endian on both supported architectures):

* a call made under another audit architecture than the process's own (``int 0x80`` i386 calls
  on x86_64) kills the process; on x86_64 every x32 call (number with bit 30 set) is denied;
* each call of :data:`DENIED` answers ``EPERM``: debugging and reading other processes, mounting
  and changing namespaces, the kernel keyring, BPF and perf, loading kernels and modules, reboot
  and swap, userfaultfd, io_uring, personality;
* ``socket`` answers ``EPERM`` whatever the family: a candidate talks only through the channels it
  was given (inherited pipes and a socket pair), so it can create no TCP/UDP socket and connect to
  no path-based or abstract Unix socket of the host (``socketpair`` stays: Python's
  multiprocessing uses it); ``clone`` answers ``EPERM`` when its flags ask for a new namespace; ``clone3``, whose
  flags the filter cannot read (they are behind a pointer), answers ``ENOSYS``, on which glibc
  falls back to ``clone``; ``prctl(PR_TASK_PERF_EVENTS_DISABLE/ENABLE)`` answers ``EPERM`` (it
  would switch off the sampler the checker watches a denial process with:
  :mod:`modulelens.validation.sampling`).

:func:`filter_program` is pure (the instructions for one architecture); :func:`apply_seccomp`
installs it on every thread of the calling process (``SECCOMP_FILTER_FLAG_TSYNC``) and says
exactly what is in force, or why nothing is.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import NamedTuple

from modulelens.sandbox.containment import Layer

# system-call numbers: (x86_64, aarch64); aarch64 uses the generic table (asm-generic/unistd.h)
DENIED: dict[str, tuple[int, int]] = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "unshare": (272, 97), "setns": (308, 268),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "bpf": (321, 280), "perf_event_open": (298, 241),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "reboot": (169, 142), "swapon": (167, 224), "swapoff": (168, 225),
    "userfaultfd": (323, 282), "io_uring_setup": (425, 425), "personality": (135, 92),
}
# calls the filter looks into: (x86_64, aarch64)
SOCKET, CLONE, CLONE3, SECCOMP, PRCTL = (41, 198), (56, 220), (435, 435), (317, 277), (157, 167)
# prctl options that switch the process's perf events (the checker's CPU-time sampler) off or on
PR_TASK_PERF_EVENTS_DISABLE, PR_TASK_PERF_EVENTS_ENABLE = 31, 32
ARCHES: dict[str, int] = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_*
X32_BIT = 0x40000000
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1


class Instruction(NamedTuple):
    """One classic-BPF instruction (``struct sock_filter``); ``jt``/``jf`` skip that many instructions."""

    code: int
    jt: int
    jf: int
    k: int


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def machine_arch() -> str:
    """This machine's architecture as :data:`ARCHES` names it (``x86_64``, ``aarch64``), else its own name."""
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def filter_program(arch: str) -> list[Instruction]:
    """The filter for ``arch`` (a key of :data:`ARCHES`), as described in the module docstring.
    Jumps are resolved from labels; every jump goes forward and fits in a byte."""
    if arch not in ARCHES:
        raise ValueError(f"no seccomp filter for architecture {arch!r}")
    i = 0 if arch == "x86_64" else 1
    # (code, label if true, label if false, k); a label None falls through; "here:" marks a label
    code: list = [
        (LD_W_ABS, None, None, OFFSET_ARCH),
        (JEQ_K, None, "kill", ARCHES[arch]),
        (LD_W_ABS, None, None, OFFSET_NR),
    ]
    if arch == "x86_64":
        code.append((JGE_K, "deny", None, X32_BIT))
    code += [(JEQ_K, "deny", None, nrs[i]) for nrs in DENIED.values()]
    code += [
        (JEQ_K, "deny", None, SOCKET[i]),
        (JEQ_K, "clone", None, CLONE[i]),
        (JEQ_K, "enosys", None, CLONE3[i]),
        (JEQ_K, "prctl", None, PRCTL[i]),
        (RET_K, None, None, RET_ALLOW),
        "prctl:", (LD_W_ABS, None, None, OFFSET_ARG0),
        (JEQ_K, "deny", None, PR_TASK_PERF_EVENTS_DISABLE),
        (JEQ_K, "deny", None, PR_TASK_PERF_EVENTS_ENABLE),
        (RET_K, None, None, RET_ALLOW),
        "clone:", (LD_W_ABS, None, None, OFFSET_ARG0),
        (JSET_K, "deny", None, CLONE_NAMESPACES),
        (RET_K, None, None, RET_ALLOW),
        "enosys:", (RET_K, None, None, RET_ERRNO | errno.ENOSYS),
        "deny:", (RET_K, None, None, RET_ERRNO | errno.EPERM),
        "kill:", (RET_K, None, None, RET_KILL_PROCESS),
    ]
    return _assembled(code)


def _assembled(code: list) -> list[Instruction]:
    """Instructions from ``(code, label if true, label if false, k)`` items and ``"label:"`` marks
    (a label None falls through); every jump goes forward and fits in a byte."""
    labels: dict[str, int] = {}
    program = []
    for item in code:
        if isinstance(item, str):
            labels[item.rstrip(":")] = len(program)
        else:
            program.append(item)

    def skip(at: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - at - 1

    return [Instruction(op, skip(n, t), skip(n, f), k) for n, (op, t, f, k) in enumerate(program)]


def denied_summary() -> str:
    """What the filter denies, in words (the detail of the seccomp layer when it is in force)."""
    calls = [*DENIED, "socket (every family: no TCP/UDP, no path-based or abstract Unix socket)",
             "clone(new namespaces)", "prctl(PR_TASK_PERF_EVENTS_DISABLE/ENABLE)"]
    return (f"deny list of {len(calls)} calls (EPERM): {', '.join(calls)}; clone3 answers ENOSYS (callers fall back "
            "to clone); a call of another architecture kills the process")


def apply_seccomp() -> Layer:
    """Install :func:`filter_program` for this machine's architecture on every thread of this
    process (and so on all it starts), after setting no_new_privs. Not in force, with the reason,
    off Linux, on another architecture, or when the kernel refuses."""
    arch = machine_arch()
    if platform.system() != "Linux":
        return Layer(name="seccomp", in_force=False, detail="not Linux")
    if arch not in ARCHES:
        return Layer(name="seccomp", in_force=False, detail=f"no filter for architecture {arch} (only x86_64, aarch64)")
    ok, how = install_filter(filter_program(arch))
    return Layer(name="seccomp", in_force=ok, detail=f"{denied_summary()}; on {how}" if ok else how)


# mprotect, pkey_mprotect and mmap: (x86_64, aarch64); PROT_EXEC, MAP_ANONYMOUS
MPROTECT, PKEY_MPROTECT, MMAP, PROT_EXEC, MAP_ANONYMOUS = (10, 226), (329, 288), (9, 222), 4, 0x20


def no_exec_program(arch: str) -> list[Instruction]:
    """A filter stacked on :func:`filter_program` where code must stay as it is: ``mprotect`` and
    ``pkey_mprotect`` asking for ``PROT_EXEC`` answer ``EPERM`` (pages made unusable stay so), and
    so does an anonymous ``mmap`` asking for it (no code written at run time, no copy of a
    library's code into fresh memory); libraries still load (a file's ``mmap`` is untouched)."""
    if arch not in ARCHES:
        raise ValueError(f"no seccomp filter for architecture {arch!r}")
    i = 0 if arch == "x86_64" else 1
    code: list = [
        (LD_W_ABS, None, None, OFFSET_ARCH),
        (JEQ_K, None, "kill", ARCHES[arch]),
        (LD_W_ABS, None, None, OFFSET_NR),
        (JEQ_K, "protect", None, MPROTECT[i]),
        (JEQ_K, "protect", None, PKEY_MPROTECT[i]),
        (JEQ_K, "map", None, MMAP[i]),
        (RET_K, None, None, RET_ALLOW),
        "protect:", (LD_W_ABS, None, None, OFFSET_ARG0 + 16),  # prot, the third argument
        (JSET_K, "deny", None, PROT_EXEC),
        (RET_K, None, None, RET_ALLOW),
        "map:", (LD_W_ABS, None, None, OFFSET_ARG0 + 16),  # prot
        (JSET_K, None, "allow", PROT_EXEC),
        (LD_W_ABS, None, None, OFFSET_ARG0 + 24),  # flags, the fourth argument
        (JSET_K, "deny", None, MAP_ANONYMOUS),
        "allow:", (RET_K, None, None, RET_ALLOW),
        "deny:", (RET_K, None, None, RET_ERRNO | errno.EPERM),
        "kill:", (RET_K, None, None, RET_KILL_PROCESS),
    ]
    return _assembled(code)


def install_filter(program: list[Instruction]) -> tuple[bool, str]:
    """Install ``program`` on every thread of this process after setting no_new_privs (filters
    stack: an earlier one stays in force). Returns (installed, on which threads or why not)."""
    libc = ctypes.CDLL(None, use_errno=True)
    filters = (_SockFilter * len(program))(*[_SockFilter(*x) for x in program])
    fprog = _SockFprog(len(program), filters)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False, f"prctl(no_new_privs): {os.strerror(ctypes.get_errno())}"
    nr = SECCOMP[0 if machine_arch() == "x86_64" else 1]
    how = "all threads"
    done = libc.syscall(ctypes.c_long(nr), ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
                        ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(fprog))
    if done > 0:  # TSYNC names the thread it could not synchronise; nothing was installed
        return False, f"seccomp(2): thread {done} could not be synchronised"
    if done < 0:
        if ctypes.get_errno() != errno.ENOSYS:
            return False, f"seccomp(2): {os.strerror(ctypes.get_errno())}"
        how = "the main thread only (no seccomp(2) to synchronise threads)"
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
            return False, f"prctl(seccomp): {os.strerror(ctypes.get_errno())}"
    return True, how
