"""Where a denial process's CPU time goes: the kernel samples the user-space program counter of
every thread of the candidate's process, and the checker names the code each sample lands in.

Why: denial poisons the dispatcher's registrations (:mod:`modulelens.validation.poison`), but
ATen's compute code itself (``at::cpu::*``, ``at::native::*``, DispatchStub kernels, the MKL and
oneDNN code linked into ``libtorch_cpu.so``) stays callable by address, however the candidate
found it (``dlsym``, ``ctypes``, parsing the ELF file or its in-memory dynamic symbols). Where it
found the address is unseen; where its time goes is not.

How:

* **the sampler** (:func:`open_task_sampler`, in the candidate process before any candidate code
  and before seccomp, which refuses ``perf_event_open``): a ``perf_event_open`` software
  task-clock event on the process itself (inherited by every thread and child it starts later),
  user space only, created disabled. Its descriptor goes to the checker with the memory-map one
  (:func:`~modulelens.sandbox.hand_over_maps`) and the candidate process closes its own: candidate
  code holds no descriptor of it. The checker alone enables, disables and reads it
  (:class:`TaskSampler`): the samples are written by the kernel into a ring buffer mapped by the
  checker. The one call that could switch it off from inside, ``prctl(PR_TASK_PERF_EVENTS_DISABLE)``,
  is refused by the seccomp layer.
* **tampering**: the event's own count of task time and the samples it wrote are compared with
  the CPU time the kernel accounts to the process (``/proc/PID/stat``, all threads): a sampler
  that saw far less than the process used (disabled somehow, threads it does not cover, samples
  lost) is named as evidence, never ignored.
* **attribution** (:func:`attribute`): each sampled address is mapped to a file through the
  process's ``/proc/PID/maps`` (written by the kernel), and within a file to the function
  containing it through the file's own symbol table (``.symtab`` when the library has one, as
  torch's do, else ``.dynsym``), read by the checker from the file itself. Samples in torch's
  compute libraries (``libtorch_cpu``, ``libtorch_cuda``, oneDNN, MKL, system BLAS/LAPACK) count
  as *compute* unless the function is the infrastructure an honest candidate uses there
  (allocation, copies and fills, the dispatcher, tensor metadata, TensorIterator set-up,
  autograd bookkeeping: :data:`_INFRASTRUCTURE`); unnamed code there counts as compute.
  A function of another file whose name is one of ATen's kernels or a BLAS routine (a copy of
  torch's library loaded from elsewhere, symbols kept) counts as compute too.

What remains unseen: compute code copied out of torch into a file of the candidate's own and
stripped of its names (it counts as the candidate's own code: the file's mapping is named, not
judged); a candidate spending so much of its own time elsewhere that torch's compute is under
:data:`COMPUTE_SHARE` of its samples (it is then some hundred times slower than the code it wraps);
computation done by another process (none is reachable from a candidate process: no sockets, its
own PID namespace; its own children are sampled, and a majority of samples there is named);
kernel-mode time (not sampled: none of torch's compute runs there). Copying torch's code into fresh
anonymous memory is refused by the denial's seccomp rule (neither ``mprotect`` to ``PROT_EXEC`` nor
an anonymous executable ``mmap``: :func:`~modulelens.sandbox.no_exec_program`); samples in anonymous
executable memory that existed before count as compute.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import shutil
import struct
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

PERIOD_NS = 25_000  # one sample per 25 us of the process's CPU time
RING_BUDGET_PAGES = 128  # data pages of all the ring buffers together (512 KiB, the unprivileged perf mlock)
MAX_CPUS = 200  # descriptors handed over in one message (SCM_MAX_FD is 253)
COMPUTE_SHARE = 0.01  # a share of samples in torch's compute code at least this -> wrapper (honest: about 0)
MIN_COMPUTE_SAMPLES = 20
COVERAGE = 0.5  # the sampler must have seen at least this share of the CPU time the process used

_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
_PERF_TYPE_SOFTWARE, _PERF_COUNT_SW_TASK_CLOCK = 1, 1
_PERF_SAMPLE_IP, _PERF_SAMPLE_TID = 1 << 0, 1 << 1
_PERF_FORMAT_TOTAL_TIME_ENABLED, _PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 0, 1 << 1
_FLAG_DISABLED, _FLAG_INHERIT, _FLAG_EXCLUDE_KERNEL, _FLAG_EXCLUDE_HV = 1 << 0, 1 << 1, 1 << 5, 1 << 6
_IOC_ENABLE, _IOC_DISABLE, _IOC_RESET = 0x2400, 0x2401, 0x2403
_RECORD_LOST, _RECORD_SAMPLE = 2, 9
_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7

# Libraries whose code is the reference (torch's compute, and the BLAS/LAPACK/oneDNN it calls).
_COMPUTE_LIBRARY = re.compile(r"(?:^|/)(?:libtorch_cpu|libtorch_cuda\w*|libdnnl|libmkl\w*|libopenblas\w*|"
                              r"libblas|libcblas|liblapack\w*|libflexiblas|libatlas|libcublas\w*|libcudnn\w*)"
                              r"[^/]*\.so[^/]*$")
# Code of those libraries that computes: DispatchStub kernels (compiled per CPU capability),
# vectorised math, the linked BLAS/LAPACK/oneDNN/fbgemm/XNNPACK/NNPACK code, loop bodies named after
# a kernel; unnamed code there counts too.
_COMPUTE_CODE = re.compile(
    r"at::native::(?:AVX2|AVX512|DEFAULT|ZVECTOR|SVE\d*|VSX|NEON)::|at::vec::|Sleef_|\bmkl_|\bMKL|dnnl|fbgemm|\bxnn_"
    r"|\bnnp_|qnnp|cpublas|\bcblas_|lapack|\b[sdczSDCZ](?:gemm|gemv|axpy|dot|trsm|syrk|ger|getr|potr|gesv)\w*"
    r"|\w+(?<!Operator)(?<!Boxed)Kernel(?:Impl)?\b|\b\w+_kernel\b")
# ... except the kernels of what an honest candidate may run there: copies, conversions and fills.
_HONEST_KERNEL = re.compile(r"\b(?:direct_)?copy_kernel|copy_same_type|\bcopy_impl\b|\bcopy_\b|\bfill_kernel|\bfill_\b"
                            r"|\bzero_\b|at::vec::\w+::convert|\bcast_outputs\b"
                            r"|\b(?:normal|uniform|random\w*|bernoulli\w*|exponential|cauchy|log_normal|geometric)_kernel")
# Names that are ATen's kernels or a BLAS routine wherever they are (a copy of torch's library).
_KERNEL_NAME = re.compile(r"at::native::(?:AVX2|AVX512|DEFAULT|ZVECTOR|SVE\d*|VSX|NEON)::|\bat::cpu::|\bmkl_blas_"
                          r"|\bmkl_vml_|Sleef_|\bdnnl::|\bcblas_|\b[sd]gemm_")


# -- in the candidate process -----------------------------------------------------------------

def open_task_sampler(period_ns: int = PERIOD_NS) -> list[int]:
    """(In a candidate process, before any candidate code and before seccomp) disabled
    ``perf_event_open`` task-clock sampling events on this process, one per CPU (the kernel maps
    no ring buffer of an inherited event that follows a task over every CPU), inherited by the
    threads and children it starts, user space only; their descriptors, none where the kernel
    refuses (``perf_event_paranoid`` above 2, a container's seccomp profile, not Linux)."""
    import platform

    machine = platform.machine().lower()
    nr = _PERF_EVENT_OPEN.get({"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine))
    if nr is None:
        return []
    attr = bytearray(_ATTR_SIZE)
    struct.pack_into("IIQQQQQ", attr, 0, _PERF_TYPE_SOFTWARE, _ATTR_SIZE, _PERF_COUNT_SW_TASK_CLOCK, period_ns,
                     _PERF_SAMPLE_IP | _PERF_SAMPLE_TID,
                     _PERF_FORMAT_TOTAL_TIME_ENABLED | _PERF_FORMAT_TOTAL_TIME_RUNNING,
                     _FLAG_DISABLED | _FLAG_INHERIT | _FLAG_EXCLUDE_KERNEL | _FLAG_EXCLUDE_HV)
    buf = ctypes.create_string_buffer(bytes(attr), _ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fds: list[int] = []
    for cpu in online_cpus()[:MAX_CPUS]:
        fd = libc.syscall(ctypes.c_long(nr), buf, ctypes.c_int(0), ctypes.c_int(cpu), ctypes.c_int(-1),
                          ctypes.c_ulong(8))  # PERF_FLAG_FD_CLOEXEC
        if fd < 0:
            for opened in fds:
                os.close(opened)
            return []
        fds.append(int(fd))
    return fds


def online_cpus() -> list[int]:
    """The CPUs the kernel has online (``/sys/devices/system/cpu/online``, else ``os.cpu_count``)."""
    try:
        with open("/sys/devices/system/cpu/online") as f:
            text = f.read().strip()
        cpus: list[int] = []
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        return cpus
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))


# -- in the checker -----------------------------------------------------------------------------

@dataclass
class Samples:
    """What the sampler recorded between :meth:`TaskSampler.start` and :meth:`TaskSampler.stop`."""

    ips: list[int] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # the process of each sample, as the sampled process names it
    lost: int = 0
    overflowed: bool = False  # a ring filled up: the kernel dropped the window's later samples (uncounted)
    sampled_ns: int = 0  # the event's own count of task time while enabled
    cpu_ns: int = 0  # CPU time the kernel accounts to the process over the same window (/proc/PID/stat)


class TaskSampler:
    """The checker's side of a candidate process's sampling events (their descriptors ``fds``,
    handed over before any candidate code): one ring buffer per event mapped here, the events
    enabled around the calls to watch and drained after them. ``pid``: the process as this
    checker's ``/proc`` names it. Raises OSError where the rings cannot be mapped."""

    def __init__(self, fds: list[int], pid: int):
        self.fds, self.pid = fds, pid
        self.data_pages = 1 << max(1, (RING_BUDGET_PAGES // max(len(fds), 1)).bit_length() - 1)
        self.rings: list[mmap.mmap] = []
        try:
            for fd in fds:
                self.rings.append(mmap.mmap(fd, (1 + self.data_pages) * mmap.PAGESIZE, mmap.MAP_SHARED,
                                            mmap.PROT_READ | mmap.PROT_WRITE))
        except OSError:
            self.close()
            raise
        self._count0 = self._cpu0 = 0

    def capacity(self) -> int:
        """Samples one ring holds between two drains (a window should stay well under it)."""
        return self.data_pages * mmap.PAGESIZE // 24

    def _ioctl(self, request: int) -> None:
        import fcntl

        for fd in self.fds:
            fcntl.ioctl(fd, request, 0)

    def _count(self) -> int:
        return sum(struct.unpack("QQQ", os.read(fd, 24))[0] for fd in self.fds)

    def start(self) -> None:
        self._drain()  # anything from before is not this window's
        self._count0, self._cpu0 = self._count(), process_cpu_ns(self.pid)
        self._ioctl(_IOC_ENABLE)

    def stop(self) -> Samples:
        self._ioctl(_IOC_DISABLE)
        cpu = process_cpu_ns(self.pid) - self._cpu0
        samples = self._drain()
        samples.sampled_ns, samples.cpu_ns = self._count() - self._count0, max(cpu, 0)
        return samples

    def _drain(self) -> Samples:
        out = Samples()
        for ring in self.rings:
            _drain_ring(ring, self.data_pages, out)
        return out

    def close(self) -> None:
        for ring in self.rings:
            try:
                ring.close()
            except (BufferError, ValueError):
                pass
        self.rings = []


def _drain_ring(ring: mmap.mmap, data_pages: int, out: Samples) -> None:
    """Read every record the kernel wrote into ``ring`` since the last drain (up to
    ``data_head``), then set ``data_tail`` past them."""
    page = mmap.PAGESIZE
    head, tail = struct.unpack_from("QQ", ring, 1024)
    data_offset, data_size = struct.unpack_from("QQ", ring, 1040)
    if not data_size:
        data_offset, data_size = page, data_pages * page

    def read(pos: int, n: int) -> bytes:
        at, end = data_offset + pos % data_size, data_offset + data_size
        if at + n <= end:
            return ring[at:at + n]
        return ring[at:end] + ring[data_offset:data_offset + n - (end - at)]

    if head - tail > data_size - 64:  # full: later samples were dropped, and the kernel could write no record of it
        out.overflowed = True
    pos = tail
    while pos + 8 <= head:
        kind, _, size = struct.unpack("IHH", read(pos, 8))
        if size < 8:
            break
        body = read(pos + 8, size - 8)
        if kind == _RECORD_SAMPLE and len(body) >= 16:
            ip, pid, _ = struct.unpack_from("QII", body)
            out.ips.append(ip)
            out.pids.append(pid)
        elif kind == _RECORD_LOST and len(body) >= 16:
            out.lost += struct.unpack_from("QQ", body)[1]
        pos += size
    struct.pack_into("Q", ring, 1032, head)


def process_cpu_ns(pid: int) -> int:
    """CPU time (user and system, every thread) the kernel accounts to process ``pid``, from
    ``/proc/PID/stat`` (readable for any process), in nanoseconds; 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return 0
    fields = text.rpartition(")")[2].split()
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (IndexError, ValueError):
        return 0
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


# -- attribution --------------------------------------------------------------------------------

@dataclass
class Place:
    """Where samples landed: a file (base name) and the function there (demangled, shortened)."""

    library: str
    function: str
    samples: int
    compute: bool


@dataclass
class Attribution:
    """Samples of a window attributed to code (:func:`attribute`)."""

    total: int
    compute: int
    places: list[Place]

    def compute_share(self) -> float:
        return self.compute / self.total if self.total else 0.0

    def route(self, top: int = 3) -> str:
        """The compute places in words: ``40% of its sampled CPU time (800 of 2000 samples) in
        torch's compute code: libtorch_cpu.so at::native::AVX2::vectorized_gelu (25%), ...``."""
        parts = [f"{p.library} {p.function} ({100 * p.samples / self.total:.1f}%)"
                 for p in self.places if p.compute][:top]
        return (f"{100 * self.compute_share():.0f}% of its sampled CPU time ({self.compute} of {self.total} samples) "
                f"in torch's compute code: " + ", ".join(parts))


def attribute(ips: list[int], maps_text: str) -> Attribution:
    """Attribute sampled addresses ``ips`` to the files and functions of ``maps_text`` (the
    process's ``/proc/PID/maps``) and decide which are compute (see the module docstring)."""
    mappings = _executable_mappings(maps_text)
    starts = [m[0] for m in mappings]
    per: Counter[tuple[str, str]] = Counter()
    by_file: dict[str, list[int]] = {}
    other = fresh = 0
    import bisect

    for ip in ips:
        i = bisect.bisect_right(starts, ip) - 1
        if i < 0 or ip >= mappings[i][1]:
            other += 1
            continue
        lo, _, offset, path = mappings[i]
        if not path:
            fresh += 1
            continue
        by_file.setdefault(path, []).append(ip - lo + offset)
    for path, offsets in by_file.items():
        if not path.startswith("/"):
            per[(path, "")] += len(offsets)  # [vdso], [vsyscall]: the kernel's own
            continue
        names = _functions_at(path, offsets)
        for name in names:
            per[(path, name)] += 1
    places = []
    for (path, name), n in per.most_common():
        compute = path.startswith("/") and _is_compute(path, name)
        places.append(Place(library=os.path.basename(path), function=_short(name), samples=n, compute=compute))
    if fresh:  # no anonymous executable memory can be had under the denial's seccomp rule: counted against it
        places.append(Place(library="(anonymous executable memory)", function="code written at run time",
                            samples=fresh, compute=True))
    if other:
        places.append(Place(library="(no executable mapping)", function="", samples=other, compute=False))
    places.sort(key=lambda p: -p.samples)
    return Attribution(total=len(ips), compute=sum(p.samples for p in places if p.compute), places=places)


@lru_cache(maxsize=65536)
def _is_compute(path: str, name: str) -> bool:
    """Whether code named ``name`` in file ``path`` is the reference's compute (module docstring)."""
    if name.startswith("(."):
        return False  # a PLT stub or the library's init/fini code
    if _COMPUTE_LIBRARY.search(path):
        return not name or bool(_COMPUTE_CODE.search(name) and not _HONEST_KERNEL.search(name))
    return bool(name) and bool(_KERNEL_NAME.search(name)) and not _HONEST_KERNEL.search(name)


def _short(name: str) -> str:
    """A demangled name without its argument lists and template arguments, at most 120 characters."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    text = re.sub(r"\s+", " ", "".join(out)).strip()
    if "callback_fn" in text or "function_ref" in text:  # a loop body: name the kernel it belongs to
        kernel = (re.search(r"\w+(?<!Operator)(?<!Boxed)Kernel(?:Impl)?\b|\b\w+_kernel\b", name)
                  or re.search(r"callback_fn<([\w:]+)", name))
        if kernel:
            text += f" of {kernel.group(kernel.lastindex or 0)}"
    return (text or name)[:160]


def _executable_mappings(maps_text: str) -> list[tuple[int, int, int, str]]:
    """(start, end, file offset, path) of the executable mappings; path '' for anonymous memory,
    ``[vdso]`` and the like for the kernel's own."""
    out = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) >= 5 and parts[1][2] == "x":
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].strip().removesuffix(" (deleted)") if len(parts) == 6 else ""
            out.append((lo, hi, int(parts[2], 16), path))
    return sorted(out)


def _functions_at(path: str, offsets: list[int]) -> list[str]:
    """For each file offset in ``path``, the demangled name of the function containing it ('' if none)."""
    try:
        st = os.stat(path)
    except OSError:
        return [""] * len(offsets)
    table = _symbol_table(path, st.st_ino, st.st_mtime_ns)
    if table is None:
        return [""] * len(offsets)
    segments, addrs, ends, names, stubs = table
    off = np.asarray(offsets, dtype=np.uint64)
    vaddr = np.full(len(off), np.iinfo(np.uint64).max, dtype=np.uint64)
    for o, v, n in segments:
        inside = (off >= o) & (off < o + n)
        vaddr[inside] = off[inside] - np.uint64(o) + np.uint64(v)
    index = np.searchsorted(addrs, vaddr, side="right").astype(np.int64) - 1
    found = (index >= 0) & (vaddr < ends[np.maximum(index, 0)]) if len(addrs) else np.zeros(len(off), bool)
    raw: dict[int, str] = {}
    out = []
    for i, ok, va in zip(index.tolist(), found.tolist(), vaddr.tolist()):
        if ok:
            if i not in raw:
                raw[i] = names[i]
            out.append(raw[i])
        else:
            out.append(next((f"({section})" for lo, hi, section in stubs if lo <= va < hi), ""))
    return _demangled(out)


_DEMANGLED: dict[str, str] = {}


def warm_symbols() -> None:
    """Read the symbol table of torch's CPU library now (about 0.1 s), so that a checker forked
    from a template that did it while idle finds it read (the harness's ``WARM``)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return
    path = os.path.join(os.path.dirname(spec.origin), "lib", "libtorch_cpu.so")
    try:
        st = os.stat(path)
    except OSError:
        return
    _symbol_table(os.path.realpath(path), st.st_ino, st.st_mtime_ns)


def _demangled(names: list[str]) -> list[str]:
    """``names`` demangled (``c++filt``, once per name and process)."""
    new = sorted({n for n in names if n.startswith("_Z") and n not in _DEMANGLED})
    tool = shutil.which("c++filt")
    if new and tool:
        try:
            text = subprocess.run([tool], input="\n".join(new), capture_output=True, text=True, timeout=30).stdout
            _DEMANGLED.update(zip(new, text.splitlines()))
        except (OSError, subprocess.SubprocessError):
            pass
    return [_DEMANGLED.get(n, n) for n in names]


@lru_cache(maxsize=16)
def _symbol_table(path: str, inode: int, mtime_ns: int):
    """(PT_LOAD segments as (file offset, vaddr, size), sorted function addresses, their ends,
    their names) of the ELF file at ``path`` (``.symtab`` when present, else ``.dynsym``); None if
    it is not a readable 64-bit little-endian ELF file. Cached per file version."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    try:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return None
        phoff, shoff = struct.unpack_from("QQ", data, 32)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("HHHHH", data, 54)
        segments = []
        for i in range(phnum):
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("IIQQQQ", data, phoff + i * phentsize)
            if p_type == 1:
                segments.append((p_offset, p_vaddr, p_filesz))
        sections = [struct.unpack_from("IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        by_type = {s[1]: s for s in sections if s[1] in (2, 11)}  # SHT_SYMTAB, SHT_DYNSYM
        sym = by_type.get(2) or by_type.get(11)
        if sym is None:
            return None
        strtab = sections[sym[6]]
        dtype = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                          ("size", "<u8")])
        table = np.frombuffer(data, dtype=dtype, count=sym[5] // 24, offset=sym[4])
        funcs = table[((table["info"] & 0xF) == 2) & (table["value"] != 0)]
        order = np.argsort(funcs["value"], kind="stable")
        funcs = funcs[order]
        addrs = funcs["value"].copy()
        ends = addrs + np.maximum(funcs["size"], 1)
        names = _Names(data, strtab[4], funcs["name"].copy())
        shstr = sections[shstrndx][4]
        stubs = []  # executable sections without function symbols: .init, .plt, .plt.got, .plt.sec, .fini
        for s_name, _, s_flags, s_addr, _, s_size, *_ in sections:
            section = data[shstr + s_name:data.find(b"\0", shstr + s_name)].decode(errors="replace")
            if s_flags & 4 and section != ".text":  # SHF_EXECINSTR
                stubs.append((s_addr, s_addr + s_size, section))
        return segments, addrs, ends, names, stubs
    except (struct.error, ValueError, IndexError):
        return None


class _Names:
    """Symbol names read from the string table on demand (the mapping stays open)."""

    def __init__(self, data: mmap.mmap, base: int, offsets: np.ndarray):
        self.data, self.base, self.offsets = data, base, offsets

    def __getitem__(self, i: int) -> str:
        start = self.base + int(self.offsets[i])
        end = self.data.find(b"\0", start)
        return self.data[start:end].decode(errors="replace")


def coverage_problem(samples: Samples) -> str | None:
    """Why the samples of a window cannot be trusted (tampering or loss), or None: the sampler
    must have counted at least :data:`COVERAGE` of the CPU time the kernel accounts to the
    process, and written samples for that share of it."""
    cpu = samples.cpu_ns
    if cpu < 50_000_000:  # below the resolution of /proc/PID/stat (ticks), nothing to compare
        return None
    if samples.sampled_ns < COVERAGE * cpu:
        return (f"the sampler counted {samples.sampled_ns / 1e6:.0f} ms of the {cpu / 1e6:.0f} ms of CPU the process "
                "used (switched off, or threads it does not cover)")
    if not samples.overflowed and (len(samples.ips) + samples.lost) * PERIOD_NS < 0.25 * samples.sampled_ns:
        return (f"the sampler wrote {len(samples.ips)} samples for {samples.sampled_ns / 1e6:.0f} ms of CPU "
                f"(one per {PERIOD_NS // 1000} us expected)")
    if samples.lost > len(samples.ips):
        return f"{samples.lost} of {samples.lost + len(samples.ips)} samples were lost"
    return None


