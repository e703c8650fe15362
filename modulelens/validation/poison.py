"""What a *denial* candidate process does to itself before any candidate code loads (see
:mod:`modulelens.validation.denial`): it makes the reference library unusable, so that a candidate
still correct there computes by itself.

* **operators** (:func:`poison_operators`): every operator of torch's dispatcher that computes --
  all namespaces (aten, prims, mkldnn, quantized, ...), every backend key it has a kernel for
  gets a kernel that raises ``modulelens denial: <op> is denied here`` (the CPU backends, and the
  CUDA ones when there is a GPU). Left alone: allocation,
  copies, views, metadata, random fills and factories without tensor arguments (constructors need
  them; none computes from the candidate's inputs). The registrations are held only by a
  reference this module leaks on purpose: no Python object reaches them to undo them, and the
  dispatcher has no call that reaches the kernels they replaced.
* **numpy, in memory** (:func:`unusable_numpy`): the executable pages of numpy and the other
  numerical libraries mapped now (their bundled BLAS included) are made inaccessible
  (``PROT_NONE``); a seccomp filter then refuses to make any page executable again; a further
  Landlock layer makes their files unreadable (no fresh copy can be loaded) and, of ``/proc``,
  leaves only a few system files (no reading this process's memory through ``/proc/PID/mem``).
  The checker reads ``/proc/PID/maps`` afterwards to see that the pages stayed so. Python's cyclic
  GC is frozen first: numpy's objects are never traversed (their code is gone).
* **numpy, for Triton's CPU interpreter** (:func:`python_numpy_denial`): the interpreter computes
  with numpy, so numpy stays; ``import numpy`` gives code outside torch, Triton and numpy itself a
  module whose every attribute raises, and the torch<->numpy crossings raise. A claim-level
  denial: a candidate digging numpy out of the interpreter's globals is not stopped. The seccomp
  filter that makes no page executable is stacked here too (:func:`no_fresh_code`).
* **no fresh code** either way: no page becomes executable (``mprotect``) and no anonymous
  executable memory is mapped, so torch's compute code cannot be copied where the checker's CPU
  time sampler would not name it; a file mapped executable is named by its own symbols.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import types
import warnings
from typing import Any

from modulelens.sandbox import FOREIGN_LIBRARIES, Layer, restrict_reading
from modulelens.validation.evidence import ALLOWED_OPS, RANDOM_FILLS

# Operators a candidate may run in a denial process: allocation, copies, views, metadata, random fills.
ALLOWED = ALLOWED_OPS | RANDOM_FILLS | {"_nested_tensor_size"}
CPU_KEYS = ("CPU", "QuantizedCPU", "SparseCPU", "SparseCsrCPU", "MkldnnCPU", "NestedTensorCPU")
CUDA_KEYS = ("CUDA", "QuantizedCUDA", "SparseCUDA", "SparseCsrCUDA", "NestedTensorCUDA")
PROC_FILES = ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/sys", "/proc/filesystems", "/proc/version",
              "/proc/loadavg", "/proc/uptime")
_BLAS_FILES = ("libblas", "libcblas", "libopenblas", "liblapack", "libmkl", "libatlas", "libflexiblas", "libdnnl")
_LEAKED: list[Any] = []


def computes(name: str) -> bool:
    """Whether the operator ``ns::name.overload`` is denied: it takes a tensor, is not a view, and
    is not allocation, a copy, metadata or a random fill (:data:`ALLOWED`)."""
    import torch

    ns, rest = name.split("::", 1)
    base, _, overload = rest.partition(".")
    if base in ALLOWED:
        return False
    try:
        schema = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")._schema
    except (AttributeError, RuntimeError):
        return False
    if schema.returns and all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return False  # a view
    return any("Tensor" in str(a.type) for a in schema.arguments)


_PLAN: list[tuple[str, str]] | None = None


def denial_plan() -> list[tuple[str, str]]:
    """(operator, dispatch key) of every kernel a denial may replace: the computing operators
    (:func:`computes`) on each CPU and CUDA key they have a kernel for. Pure introspection of the
    dispatcher (no operator runs, CUDA is not initialised), computed once per process: a fork
    server template computes it while idle (the harness's ``WARM``), so that a denial process
    forked from it only registers its kernels (about 0.14 s instead of 0.4 s here)."""
    global _PLAN
    if _PLAN is None:
        import torch

        has_kernel = torch._C._dispatch_has_computed_kernel_for_dispatch_key
        _PLAN = [(name, key) for name in torch._C._dispatch_get_all_op_names() if computes(name)
                 for key in CPU_KEYS + CUDA_KEYS if has_kernel(name, key)]
    return _PLAN


def poison_operators(keep: frozenset[str] = frozenset()) -> int:
    """Replace every computing operator's kernel (each key of the CPU backends, and of the CUDA ones
    when there is a GPU, that it has a kernel for: :func:`denial_plan`) by one that raises, except
    the aten operators whose base name is in ``keep`` (the library operators a partially fusing
    module candidate declares: :mod:`modulelens.kernels.library_ops`; every overload kept). Returns
    how many kernels were replaced."""
    import torch

    keys = set(CPU_KEYS + (CUDA_KEYS if torch.cuda.is_available() else ()))

    def denied(name: str):
        def kernel(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"modulelens denial: {name} is denied here")
        return kernel

    libraries: dict[str, Any] = {}
    count = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each override warns that it overrides
        for name, key in denial_plan():
            if key not in keys or (name.startswith("aten::") and name[6:].split(".", 1)[0] in keep):
                continue
            ns, rest = name.split("::", 1)
            lib = libraries.get(ns)
            if lib is None:
                lib = libraries[ns] = torch._C._dispatch_library("IMPL", ns, "", "", 0)
            lib.impl(rest, key, denied(name), False)
            count += 1
    for lib in libraries.values():  # kept alive by a reference nothing can find (not gc-tracked)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(lib))
    libraries.clear()
    return count


_LIBRARY_PATHS: dict[tuple[str, ...], list[str]] = {}


def numerical_library_paths() -> list[str]:
    """Folders of numerical libraries (:data:`FOREIGN_LIBRARIES` and their bundled ``.libs``) on
    the import path and in the system's Python folders, and system BLAS/LAPACK library files.
    Looked up once per import path and process (a fork server template does it while idle)."""
    key = tuple(sys.path)
    if key not in _LIBRARY_PATHS:
        _LIBRARY_PATHS[key] = _find_numerical_libraries()
    return list(_LIBRARY_PATHS[key])


def _find_numerical_libraries() -> list[str]:
    import glob

    places = {p for p in sys.path if p and os.path.isdir(p)}
    places.update(glob.glob("/usr/lib/python3*/dist-packages") + glob.glob("/usr/lib/python3/dist-packages")
                  + glob.glob("/usr/local/lib/python3*/dist-packages") + glob.glob("/usr/local/lib/python3*/site-packages"))
    found = []
    for place in sorted(places):
        for name in FOREIGN_LIBRARIES:
            for folder in (name, name + ".libs"):
                path = os.path.join(place, folder)
                if os.path.isdir(path):
                    found.append(os.path.realpath(path))
    for libdir in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64"):
        for prefix in _BLAS_FILES:
            for path in glob.glob(os.path.join(libdir, prefix + "*")) + glob.glob(os.path.join(libdir, "*", prefix + "*")):
                found.append(os.path.realpath(path))
    return sorted(set(found))


def executable_ranges(maps_text: str, roots: list[str]) -> list[tuple[int, int, str]]:
    """(start, end, file) of the executable mappings in ``maps_text`` (a ``/proc/PID/maps``)
    whose file lies under one of ``roots``."""
    out = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[1][2] == "x" and _under(parts[5].strip(), roots):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, parts[5].strip()))
    return out


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def unusable_numpy(readable: list[str]) -> tuple[str, list[Layer]]:
    """Make numpy and the other numerical libraries unusable in this process (see the module
    docstring); ``readable``: what the process may read so far. Returns (what was done, layers)."""
    from modulelens.sandbox import install_filter, machine_arch, no_exec_program

    roots = numerical_library_paths()
    with open("/proc/self/maps") as f:
        ranges = executable_ranges(f.read(), roots)
    gc.collect()
    gc.freeze()  # numpy's objects are never traversed again (their code is about to go)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    failed = [path for lo, hi, path in ranges if libc.mprotect(lo, hi - lo, 0) != 0]
    layers = []
    try:
        ok, how = install_filter(no_exec_program(machine_arch()))
    except ValueError as e:
        ok, how = False, str(e)
    layers.append(Layer(name="seccomp (no page made executable)", in_force=ok, detail=how))
    layers.append(restrict_reading([p for p in readable if os.path.realpath(p) != "/proc"] + list(PROC_FILES), roots))
    files = sorted({os.path.basename(p) for _, _, p in ranges})
    what = (f"{len(ranges)} executable mappings of {len(files)} numerical-library files made inaccessible"
            + (f" ({len(failed)} refused)" if failed else ""))
    return what, layers


class _DeniedNumpy(types.ModuleType):
    """``numpy`` as code outside torch, Triton and numpy sees it in an interpreter denial process."""

    def __init__(self, real: types.ModuleType):
        super().__init__("numpy")
        self.__dict__["_real"] = real

    def __getattr__(self, name: str) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "").split(".")[0]
        if caller not in ("triton", "numpy", "torch"):
            raise ImportError(f"modulelens denial: numpy.{name} is denied here")
        return getattr(self.__dict__["_real"], name)


def python_numpy_denial() -> str:
    """Deny numpy to code outside torch, Triton and numpy (see the module docstring)."""
    import torch

    real = sys.modules.get("numpy")
    if real is None:
        return "numpy was not loaded"
    _LEAKED.append(real)
    sys.modules["numpy"] = _DeniedNumpy(real)

    def refuse(name: str, original: Any) -> Any:
        def crossing(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "").split(".")[0]
            if caller not in ("triton", "torch"):
                raise RuntimeError(f"modulelens denial: {name} is denied here")
            return original(*args, **kwargs)
        return crossing

    torch.Tensor.numpy = refuse("Tensor.numpy", torch.Tensor.numpy)
    torch.Tensor.__array__ = refuse("Tensor.__array__", torch.Tensor.__array__)
    torch.from_numpy = refuse("torch.from_numpy", torch.from_numpy)
    return ("numpy kept for Triton's CPU interpreter; denied at the Python level to other code (import numpy, "
            "Tensor.numpy, __array__, from_numpy); " + no_fresh_code())


def no_fresh_code() -> str:
    """Stack the seccomp filter that makes no page executable (no ``mprotect`` to ``PROT_EXEC``, no
    anonymous executable ``mmap``: :func:`~modulelens.sandbox.no_exec_program`), so that torch's
    code cannot be copied into fresh memory where the sampler (:mod:`.sampling`) would not name it.
    Returns what is in force, in words."""
    from modulelens.sandbox import install_filter, machine_arch, no_exec_program

    try:
        ok, how = install_filter(no_exec_program(machine_arch()))
    except ValueError as e:
        ok, how = False, str(e)
    return "seccomp: no page made executable" + ("" if ok else f" (not in force: {how})")
