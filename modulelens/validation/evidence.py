"""Wrapper evidence: which aten ops a candidate ran that compute (rather than allocate, copy or
view), which vendor-library or past-the-dispatcher ATen symbols the libraries it built and loaded
import (found in its memory map and read with ``nm`` by the checker), and what the
foreign-library evidence is based on and cannot see."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import torch

from modulelens.ops import classify

# Operators a custom kernel may call: allocation, copies, views and metadata.
ALLOWED_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "full", "full_like", "new_full", "fill_", "zero_", "copy_", "clone", "contiguous", "_to_copy", "to", "resize_",
    "set_", "lift_fresh_copy", "lift_fresh", "lift", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel",
    "is_same_size", "equal", "detach", "detach_", "alias", "item", "size", "stride", "numel", "dim", "is_contiguous",
    "data_ptr", "_unsafe_view", "_reshape_alias", "_copy_from", "_copy_from_and_resize",
    "_has_compatible_shallow_copy_type", "_version", "record_stream",
})
# Random fills: how eager draws dropout masks (empty_like(x).bernoulli_(1 - p)); a candidate that
# draws them the same way (so its masks match eager's under the same RNG state) computes nothing with them.
RANDOM_FILLS = frozenset({"uniform_", "normal_", "random_", "exponential_", "cauchy_", "log_normal_", "geometric_",
                          "bernoulli_"})
# Library symbols a compiled candidate must not import: vendor libraries and ATen's kernels called
# past the dispatcher (at::cpu::gelu, at::native::...), which no dispatcher trace can see.
# dlsym and friends too: a library that looks its calls up at run time hides them from this list.
_LIBRARY_SYMBOL = re.compile(r"^(cublas\w*|cublasLt\w*|cudnn\w*|mkl_\w+|cblas_\w+|dnnl\w*|dlv?sym|dlm?open|"
                             r"at::(?:cpu|cuda|native|compositeexplicitautograd|compositeimplicitautograd)::\w+)")

FOREIGN_EVIDENCE = ("foreign numerical libraries (scipy, numba, jax, tensorflow, cupy, numpy's lazily loaded "
                    "parts) newly mapped by the candidate's process after the harness's own imports, read by the "
                    "checker from /proc/PID/maps (the kernel writes it; the candidate cannot forge it); crossings "
                    "between torch and numpy during the calls (Tensor.numpy, __array__, from_numpy, "
                    "as_tensor/tensor of an ndarray), counted in the candidate's process (a claim)")
NOT_SEEN = ("not seen: how a candidate finds torch's own kernels or BLAS at run time (dlsym, ctypes, parsing the "
            "ELF): where the reference library is denied, the CPU time it spends in them is seen instead; compute "
            "code copied into a file of its own and stripped of its names; GPU time; numpy's core shows only "
            "through the crossings and the denial run (torch maps it at import)")
LIBRARY_EVIDENCE = ("the libraries the candidate built and loaded (its process's memory map, read by the checker: "
                    "shared objects in its scratch folder or the build cache), their imported symbols read by the "
                    "checker with nm from the very file mapped (same inode)")


def computing_ops(names: list[str]) -> list[str]:
    """The aten ops among ``names`` that compute (not allocation, copies, views or metadata)."""
    out = []
    for name in names:
        if not name.startswith("aten::"):
            continue
        base, _, overload_name = name.split("::", 1)[1].partition(".")
        if base in ALLOWED_OPS or base in RANDOM_FILLS:
            continue
        packet = getattr(torch.ops.aten, base, None)
        names = [overload_name or "default"] if packet is None or overload_name else packet.overloads()
        overloads = [getattr(packet, n, None) for n in names] if packet is not None else []
        if any(o is not None and classify(o) == "view" for o in overloads):
            continue  # the profiler names ops without their overload: a view under any overload is a view
        out.append(name)
    return out


def library_symbols(library: Path, fd: int | None = None) -> list[str]:
    """Vendor-library and past-the-dispatcher ATen symbols the extension file imports (read with
    ``nm`` by the checker, not reported by the candidate); with ``fd``, read from that open file
    (``library`` then only names it)."""
    nm = shutil.which("nm")
    if not nm:
        return []
    path = f"/proc/self/fd/{fd}" if fd is not None else str(library)
    try:
        text = subprocess.run([nm, "-D", "--undefined-only", "-C", path], capture_output=True, text=True,
                              timeout=60, pass_fds=(fd,) if fd is not None else ()).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = set()
    for line in text.splitlines():  # "                 U at::cpu::_softmax(at::Tensor const&, long, bool)"
        sym = line.strip().partition(" ")[2].strip()
        m = _LIBRARY_SYMBOL.match(sym)
        if m:
            found.add(m.group(0))
    return sorted(found)


def mapped_libraries(maps_text: str, roots: list[Path]) -> dict[str, int]:
    """``{file: inode}`` of the shared objects mapped in ``maps_text`` (a ``/proc/PID/maps``, which
    the kernel writes) that lie under ``roots``; a file deleted since it was mapped keeps the
    kernel's `` (deleted)`` mark."""
    prefixes = [str(Path(os.path.realpath(r))).rstrip("/") + "/" for r in roots]
    found: dict[str, int] = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith(tuple(prefixes)) and ".so" in os.path.basename(parts[5]):
            found[parts[5].strip()] = int(parts[4])
    return found


def built_library_symbols(libraries: dict[str, int], runtime: list[Path] = ()) -> list[str]:
    """For each library (``{file: inode}``, :func:`mapped_libraries`), the vendor and ATen symbols
    it imports as ``symbol (file name)``, read from the file opened without following links and
    only when it is still the inode mapped; a library that was deleted or replaced on disk after
    it was loaded is named as such (its symbols cannot be checked). Libraries under ``runtime``
    (Triton's generated launchers, which load the GPU driver with dlopen) may import ``dl*``."""
    found = []
    runtime_prefixes = tuple(str(r).rstrip("/") + "/" for r in runtime)
    for path, inode in sorted(libraries.items()):
        name = os.path.basename(path.removesuffix(" (deleted)"))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            found.append(f"{name} was deleted or replaced after it was loaded (its symbols cannot be checked)")
            continue
        try:
            st = os.fstat(fd)
            if st.st_ino != inode or not (st.st_mode & 0o170000 == 0o100000):
                found.append(f"{name} was replaced on disk after it was loaded (its symbols cannot be checked)")
                continue
            symbols = library_symbols(Path(path), fd=fd)
            if path.startswith(runtime_prefixes):
                symbols = [sym for sym in symbols if not sym.startswith("dl")]
            found += [f"{sym} ({name})" for sym in symbols]
        finally:
            os.close(fd)
    return found
