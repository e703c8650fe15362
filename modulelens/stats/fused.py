"""One-pass moments of CPU tensors: a small C function (``moments.c``) compiled on first use.

:func:`moments_cpu` reads a contiguous float32, float64 or bfloat16 CPU tensor once and returns
the moment vector of :mod:`modulelens.stats.stats` (every element read: ``sampled`` is 0). Written
with PyTorch operators the same vector takes about ten passes over the tensor and as many
operator dispatches, which dominate a sampled training step of a model with many small modules.
:func:`zero_rows_cpu` finds the rows of a gradient that are exactly zero (units no gradient reached).

The library is built with the system C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) into
the build folder (``$MODULELENS_BUILD_DIR``, else ``$XDG_CACHE_HOME/modulelens/build``) under a
name that hashes the source, the compiler and the platform, so each machine builds it once (a
fraction of a second) and later runs load it. Without a compiler, or when the build fails,
:func:`moments_cpu` returns None and callers use the PyTorch path; :func:`unavailable` says why.
Setting ``MODULELENS_FUSED_MOMENTS=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("moments.c")
FLAGS = ["-O3", "-funroll-loops", "-fopenmp-simd", "-fPIC", "-shared", "-std=c11"]
_DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}
BUILD_TIMEOUT_S = 120.0

_lock = threading.Lock()
_state: dict[str, object] = {}  # "fn": the C function, or "why": the reason there is none
_out = threading.local()


def _build_dir() -> Path:
    base = os.environ.get("MODULELENS_BUILD_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "modulelens" / "build"
    return Path(base) / "stats-moments"


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc and shutil.which(cc.split()[0]):
        return cc
    return next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)


def _build(cc: str) -> Path:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + cc.encode() + " ".join(FLAGS).encode() + platform.platform().encode()
                         + sys.implementation.cache_tag.encode()).hexdigest()[:16]
    lib = _build_dir() / f"moments-{key}.so"
    if lib.is_file():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        out = Path(tmp) / lib.name
        cmd = [*cc.split(), *FLAGS, str(SOURCE), "-o", str(out), "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:1])} failed: {(done.stderr or done.stdout).strip()[-300:]}")
        os.replace(out, lib)  # atomic: concurrent builders leave one complete file
    return lib


def _load() -> object | None:
    with _lock:
        if "fn" in _state or "why" in _state:
            return _state.get("fn")
        if os.environ.get("MODULELENS_FUSED_MOMENTS") == "0":
            _state["why"] = "turned off (MODULELENS_FUSED_MOMENTS=0)"
            return None
        cc = _compiler()
        if cc is None:
            _state["why"] = "no C compiler found (set CC, or install gcc or clang)"
            return None
        try:
            lib = ctypes.CDLL(str(_build(cc)))
        except Exception as e:  # noqa: BLE001 - any build or load problem: use the PyTorch path
            _state["why"] = f"the C helper could not be built ({type(e).__name__}: {e})"
            return None
        fn = lib.modulelens_moments
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_double,
                       ctypes.c_void_p]
        rows = lib.modulelens_zero_rows
        rows.restype = ctypes.c_int64
        rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p,
                         ctypes.c_void_p]
        _state["zero_rows"] = rows
        _state["fn"] = fn
        return fn


def unavailable() -> str | None:
    """Why the one-pass path is not used in this process (None: it is, or was not needed yet)."""
    return _state.get("why")  # type: ignore[return-value]


def moments_cpu(flat: torch.Tensor, saturation: tuple[float, float] | None,
                threshold: float) -> list[float] | None:
    """The moment vector of a flat CPU tensor in one pass, or None when the C helper is not
    available or the tensor is not a contiguous float32/float64/bfloat16 tensor.
    ``saturation`` = (centre, half-range): count elements with |x - centre| >= threshold * half-range."""
    code = _DTYPES.get(flat.dtype)
    if code is None or not flat.is_contiguous() or flat.device.type != "cpu":
        return None
    fn = _state.get("fn") or _load()
    if fn is None:
        return None
    buf = getattr(_out, "buf", None)
    if buf is None:
        buf = _out.buf = (ctypes.c_double * 13)()
    centre, half = saturation if saturation is not None else (0.0, 0.0)
    fn(flat.data_ptr(), flat.numel(), code, int(saturation is not None), centre, threshold * half, buf)  # type: ignore[operator]
    return list(buf)


def zero_rows_cpu(grad: torch.Tensor, every: int, previous: torch.Tensor | None) -> tuple[torch.Tensor, int] | None:
    """(which of every ``every``-th row of a contiguous CPU gradient (viewed as rows x the rest) are
    exactly zero, how many of them were zero in ``previous`` too), read with the C helper (it stops
    at a row's first nonzero element); None when the helper or the dtype is not available."""
    code = _DTYPES.get(grad.dtype)
    if code is None or not grad.is_contiguous() or grad.device.type != "cpu" or grad.dim() < 1:
        return None
    if (_state.get("fn") or _load()) is None:
        return None
    cols = grad.numel() // max(grad.shape[0], 1)
    rows = -(-grad.shape[0] // every)
    zero = torch.empty(rows, dtype=torch.bool)
    prev = previous.data_ptr() if previous is not None and previous.shape == zero.shape else None
    both = _state["zero_rows"](grad.data_ptr(), rows, cols, every * cols, code, prev, zero.data_ptr())  # type: ignore[operator]
    return zero, both
