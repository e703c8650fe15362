"""The seccomp layer: the BPF program decoded and run by a small interpreter here, and a candidate
whose forbidden system calls answer EPERM inside the sandbox."""

from __future__ import annotations

import errno
import textwrap

import pytest
from conftest import full_report

from modulelens.registry import ToolContext
from modulelens.sandbox.seccomp import ARCHES, CLONE, CLONE3, DENIED, SOCKET, filter_program, machine_arch
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

ALLOW, KILL = "allow", "kill"
OPCODES = {0x20: "ld", 0x15: "jeq", 0x35: "jge", 0x45: "jset", 0x06: "ret"}


def run_filter(program, arch: int, nr: int, arg0: int = 0) -> str | int:
    """Run the classic-BPF ``program`` on one ``seccomp_data``: 'allow', 'kill' or the errno returned."""
    data = {0: nr, 4: arch, 16: arg0 & 0xFFFFFFFF}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        op = OPCODES[code]
        if op == "ret":
            if k == 0x7FFF0000:
                return ALLOW
            if k == 0x80000000:
                return KILL
            assert k & 0xFFFF0000 == 0x00050000, hex(k)
            return k & 0xFFFF
        if op == "ld":
            acc = data[k]
            pc += 1
            continue
        taken = {"jeq": acc == k, "jge": acc >= k, "jset": bool(acc & k)}[op]
        pc += 1 + (jt if taken else jf)


@pytest.mark.parametrize("arch", list(ARCHES))
def test_filter_program_is_well_formed_and_denies_the_list(arch):
    program = filter_program(arch)
    i = list(ARCHES).index(arch)
    assert 0 < len(program) < 256
    for pc, (code, jt, jf, k) in enumerate(program):
        assert code in OPCODES and 0 <= jt < 256 and 0 <= jf < 256 and 0 <= k < 1 << 32
        if OPCODES[code] != "ret":
            assert pc + 1 + max(jt, jf) < len(program), "a jump leaves the program"
    assert OPCODES[program[-1].code] == "ret"
    native, other = ARCHES[arch], next(a for a in ARCHES.values() if a != ARCHES[arch])
    for name, nrs in DENIED.items():
        assert run_filter(program, native, nrs[i]) == errno.EPERM, name
    for family in (1, 2, 10, 16, 17):  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET: no socket at all
        assert run_filter(program, native, SOCKET[i], family) == errno.EPERM
    assert run_filter(program, native, CLONE[i], 0x11) == ALLOW  # fork: SIGCHLD
    assert run_filter(program, native, CLONE[i], 0x11 | 0x10000000) == errno.EPERM  # CLONE_NEWUSER
    assert run_filter(program, native, CLONE3[i]) == errno.ENOSYS
    for allowed in (0, 1, 59, 63, 64, 221, 231):  # read/write/execve on either table
        if allowed not in {nrs[i] for nrs in DENIED.values()} | {SOCKET[i], CLONE[i]}:
            assert run_filter(program, native, allowed) == ALLOW, allowed
    assert run_filter(program, other, 0) == KILL
    assert run_filter(program, 0x40000003, 0) == KILL  # i386
    if arch == "x86_64":
        assert run_filter(program, native, 0x40000000 | 101) == errno.EPERM  # x32 ptrace


def test_unknown_architecture_has_no_filter():
    with pytest.raises(ValueError, match="riscv64"):
        filter_program("riscv64")


@pytest.mark.slow
@pytest.mark.skipif(machine_arch() not in ARCHES, reason="no seccomp filter for this architecture")
def test_forbidden_calls_answer_eperm_in_the_sandbox(softmax_card):
    """A candidate tries ptrace, sockets of each family and unshare at import and reports the errors
    it got through its exception; a socket pair and a child process still work."""
    source = textwrap.dedent("""
        import ctypes, errno, os, socket, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        seen = []
        def note(name, rc):
            seen.append(f"{name}={errno.errorcode.get(ctypes.get_errno(), '?') if rc != 0 else 'ok'}")
        note("ptrace", libc.ptrace(16, os.getppid() or 1, 0, 0))  # PTRACE_ATTACH
        note("unshare", libc.unshare(0x40000000))  # CLONE_NEWNET
        note("perf_off", libc.prctl(31, 0, 0, 0, 0))  # PR_TASK_PERF_EVENTS_DISABLE: the checker's sampler
        links = []  # the sampler's descriptors went to the checker: none is left here
        for fd in range(1024):
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        seen.append(f"perf_fds={sum('perf_event' in link for link in links)}" if links else "perf_fds=unreadable")
        for name, family in (("inet", socket.AF_INET), ("inet6", socket.AF_INET6), ("unix", socket.AF_UNIX)):
            try:
                socket.socket(family, socket.SOCK_STREAM).close()
                seen.append(f"{name}=ok")
            except OSError as e:
                seen.append(f"{name}={errno.errorcode.get(e.errno, '?')}")
        socket.socketpair()[0].close()
        seen.append("pair=ok")
        seen.append("child=" + subprocess.run(["sh", "-c", "echo ran"], capture_output=True, text=True).stdout.strip())

        def forward(x, dim, half_to_float):
            raise RuntimeError("report " + " ".join(seen))
        """)
    repo, card_id = softmax_card
    r = validate_kernel(ValidateKernelRequest(source_text=source, target=card_id, backend="triton"),
                        ToolContext(repo_root=repo))
    assert r.verdict == "rejected"
    for part in ("ptrace=EPERM", "unshare=EPERM", "perf_off=EPERM", "perf_fds=0", "inet=EPERM", "inet6=EPERM", "unix=EPERM", "pair=ok", "child=ran"):
        assert part in r.reason, (part, r.reason)
    # the reply keeps the layer's name; its detail is in the stored report the reply points to
    seccomp = next(x for x in r.isolation.layers if x.name == "seccomp")
    assert seccomp.in_force and not seccomp.detail, r.isolation.summary()
    stored = full_report(r)
    assert stored is not r
    seccomp = next(x for x in stored.isolation.layers if x.name == "seccomp")
    assert seccomp.in_force and "ptrace" in seccomp.detail, stored.isolation.summary()


def test_layer_reports_what_is_in_force_or_why_not():
    """Checked in a child process: installing a filter cannot be undone."""
    import subprocess
    import sys

    code = "from modulelens.sandbox.seccomp import apply_seccomp; print(apply_seccomp().model_dump_json())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    from modulelens.sandbox.containment import Layer

    layer = Layer.model_validate_json(done.stdout.strip().splitlines()[-1])
    if machine_arch() in ARCHES:
        assert layer.in_force and layer.detail.startswith(f"deny list of {len(DENIED) + 3} calls (EPERM): ptrace,")
    else:
        assert not layer.in_force and machine_arch() in layer.detail
