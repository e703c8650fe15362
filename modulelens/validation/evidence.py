"""Wrapper evidence: which aten ops a candidate ran that compute (rather than allocate, copy or
view), which vendor-library or past-the-dispatcher ATen symbols its extension imports (read with
``nm`` by the checker), and what the foreign-library evidence is based on and cannot see."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import torch

from modulelens.ops.recorder import classify

# Operators a custom kernel may call: allocation, copies, views and metadata.
_ALLOWED = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "full", "full_like", "new_full", "fill_", "zero_", "copy_", "clone", "contiguous", "_to_copy", "to", "resize_",
    "set_", "lift_fresh_copy", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "is_same_size",
    "equal", "detach", "alias", "item", "size", "stride", "numel", "dim", "is_contiguous", "data_ptr",
}
# Library symbols a compiled candidate must not import: vendor libraries and ATen's kernels called
# past the dispatcher (at::cpu::gelu, at::native::...), which no dispatcher trace can see.
_LIBRARY_SYMBOL = re.compile(r"^(cublas\w*|cublasLt\w*|cudnn\w*|mkl_\w+|cblas_\w+|dnnl\w*|"
                             r"at::(?:cpu|cuda|native|compositeexplicitautograd|compositeimplicitautograd)::\w+)")

FOREIGN_EVIDENCE = ("foreign numerical libraries (scipy, numba, jax, tensorflow, cupy, numpy's lazily loaded "
                    "parts) newly mapped by the candidate's process after the harness's own imports, read by the "
                    "checker from /proc/PID/maps (the kernel writes it; the candidate cannot forge it); crossings "
                    "between torch and numpy during the calls (Tensor.numpy, __array__, from_numpy, "
                    "as_tensor/tensor of an ndarray), counted in the candidate's process (a claim)")
NOT_SEEN = ("not seen: numpy's core (torch maps it at import, so its use shows only through the crossings), "
            "and symbols resolved at run time (dlsym)")


def computing_ops(names: list[str]) -> list[str]:
    """The aten ops among ``names`` that compute (not allocation, copies, views or metadata)."""
    out = []
    for name in names:
        if not name.startswith("aten::"):
            continue
        base = name.split("::", 1)[1].split(".")[0]
        if base in _ALLOWED:
            continue
        packet = getattr(torch.ops.aten, base, None)
        overload = getattr(packet, "default", None) if packet is not None else None
        if overload is not None and classify(overload) == "view":
            continue
        out.append(name)
    return out


def library_symbols(library: Path) -> list[str]:
    """Vendor-library and past-the-dispatcher ATen symbols the extension file imports (read with
    ``nm`` by the checker, not reported by the candidate)."""
    nm = shutil.which("nm")
    if not nm:
        return []
    try:
        text = subprocess.run([nm, "-D", "--undefined-only", "-C", str(library)], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = set()
    for line in text.splitlines():  # "                 U at::cpu::_softmax(at::Tensor const&, long, bool)"
        sym = line.strip().partition(" ")[2].strip()
        m = _LIBRARY_SYMBOL.match(sym)
        if m:
            found.add(m.group(0))
    return sorted(found)
