"""One-pass moments of CPU tensors: a small C function (``moments.c``) compiled on first use.

:func:`moments_cpu` reads a contiguous float32, float64 or bfloat16 CPU tensor once and returns
the moment vector of :mod:`modulelens.stats.stats` (every element read: ``sampled`` is 0). Written
with PyTorch operators the same vector takes about ten passes over the tensor and as many
operator dispatches, which dominate a sampled training step of a model with many small modules.
:func:`zero_rows_cpu` finds the rows of a gradient that are exactly zero (units no gradient reached).
:func:`softmax_rows_cpu` reduces softmax rows from their logits; :func:`param_before_cpu` and
:func:`param_after_cpu` take the parameter statistics of an optimizer step in one call each: a
sampled step of a model with many small tensors pays for each dispatch, not for the arithmetic.

The library is built with the system C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) into
the build folder (``$MODULELENS_BUILD_DIR``, else ``$XDG_CACHE_HOME/modulelens/build``) under a
name that hashes the source, the compiler and the platform, so each machine builds it once (a
fraction of a second) and later runs load it. Without a compiler, or when the build fails,
:func:`moments_cpu` returns None and callers use the PyTorch path; :func:`unavailable` says why.
Setting ``MODULELENS_FUSED_MOMENTS=0`` turns it off.
"""

from __future__ import annotations

import array
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
DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}  # the C helper's dtype codes
BUILD_TIMEOUT_S = 120.0

_lock = threading.Lock()
_state: dict[str, object] = {}  # "fn": the C function, or "why": the reason there is none
_out = threading.local()
_F64x13 = ctypes.c_double * 13


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
        soft = lib.modulelens_softmax_rows
        soft.restype = None
        soft.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p]
        _state["softmax_rows"] = soft
        att = lib.modulelens_attention_rows
        att.restype = None
        att.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int64] * 6,
                        ctypes.c_double, ctypes.c_int, ctypes.c_void_p, ctypes.c_double, ctypes.c_void_p]
        _state["attention_rows"] = att
        sq = lib.modulelens_sum_squares
        sq.restype = ctypes.c_double
        sq.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
        _state["sum_squares"] = sq
        for name in ("param_before", "param_after"):
            f = getattr(lib, f"modulelens_{name}")
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
            _state[name] = f
        _state["fn"] = fn
        return fn


def available() -> bool:
    """Whether the C helper can be used in this process (built and loaded on first call)."""
    return (_state.get("fn") or _load()) is not None


def dtype_code(t: torch.Tensor) -> int | None:
    """The C helper's code of a contiguous CPU tensor's dtype, or None when it cannot read it."""
    code = DTYPES.get(t.dtype)
    return code if code is not None and t.is_cpu and t.is_contiguous() else None


def unavailable() -> str | None:
    """Why the one-pass path is not used in this process (None: it is, or was not needed yet)."""
    return _state.get("why")  # type: ignore[return-value]


def moments_cpu(t: torch.Tensor, saturation: tuple[float, float] | None,
                threshold: float) -> list[float] | None:
    """The moment vector of a CPU tensor in one pass, or None when the C helper is not available or
    the tensor is not a non-empty contiguous float32/float64/bfloat16 tensor (any shape: its elements
    are read in memory order). ``saturation`` = (centre, half-range): count elements with
    |x - centre| >= threshold * half-range."""
    code = DTYPES.get(t.dtype)
    if code is None or not t.is_cpu or not t.is_contiguous():
        return None
    n = t.numel()
    fn = _state.get("fn") or _load()
    if fn is None or n == 0:
        return None
    buf = _F64x13()
    if saturation is None:
        fn(t.data_ptr(), n, code, 0, 0.0, 0.0, buf)  # type: ignore[operator]
    else:
        fn(t.data_ptr(), n, code, 1, saturation[0], threshold * saturation[1], buf)  # type: ignore[operator]
    return buf[:]  # a list (five times faster than list(buf))


def sum_squares_cpu(t: torch.Tensor) -> float | None:
    """The sum of the squares of a contiguous float32/float64/bfloat16 CPU tensor, accumulated in
    double (NaN/Inf propagate), or None when the C helper or the tensor does not allow it."""
    code = DTYPES.get(t.dtype)
    if code is None or not t.is_cpu or not t.is_contiguous() or (_state.get("fn") or _load()) is None:
        return None
    return _state["sum_squares"](t.data_ptr(), t.numel(), code)  # type: ignore[operator]


def zero_rows_cpu(grad: torch.Tensor, every: int, previous: torch.Tensor | None) -> tuple[torch.Tensor, int] | None:
    """(which of every ``every``-th row of a contiguous CPU gradient (viewed as rows x the rest) are
    exactly zero, how many of them were zero in ``previous`` too), read with the C helper (it stops
    at a row's first nonzero element); None when the helper or the dtype is not available."""
    code = DTYPES.get(grad.dtype)
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


def softmax_rows_cpu(logits: torch.Tensor, onehot: float) -> list[float] | None:
    """[rows, sum of normalised entropies, sum of largest probabilities, rows with one at least
    ``onehot``] of the softmax of each row of a (rows, n) CPU logits matrix (-inf: masked; rows with
    fewer than two unmasked entries left out), in one pass in C; None without the C helper."""
    if not available():
        return None
    x = logits.detach().to(torch.float32).contiguous()
    out = (ctypes.c_double * 4)()
    _state["softmax_rows"](x.data_ptr(), x.shape[0], x.shape[1], onehot, out)  # type: ignore[operator]
    return out[:]


_I64x4 = ctypes.c_int64 * 4
_F64x4 = ctypes.c_double * 4


def _work(n: int) -> ctypes.Array:
    """This thread's float scratch area of at least ``n`` floats (reused from call to call)."""
    buf = getattr(_out, "work", None)
    if buf is None or len(buf) < n:
        buf = _out.work = (ctypes.c_float * max(n, 4096))()
    return buf


def attention_rows_cpu(q: int, q_strides: list[int], k: int, k_strides: list[int], nb0: int, nb1: int, rows: int,
                       step: int, dim: int, keys: int, scale: float, causal: bool, onehot: float) -> list[float] | None:
    """As :func:`softmax_rows_cpu` for the attention weights softmax(q k^T * scale) of
    ``scaled_dot_product_attention`` without a mask (``causal``: query i sees keys 0..i), for the
    query rows 0, step, 2 step... (``rows`` of them) of float32 CPU tensors q (nb0, nb1, L, dim) and
    k (nb0, nb1, keys, dim) at addresses ``q`` and ``k``, read through their strides (0 where a
    batch dimension broadcasts); None without the C helper."""
    if not available():
        return None
    out = _F64x4()
    _state["attention_rows"](q, _I64x4(*q_strides), k, _I64x4(*k_strides), nb0, nb1, rows, step, dim, keys,  # type: ignore[operator]
                             scale, int(causal), _work((dim + 1) * keys), onehot, out)
    return out[:]


PARAM_FIELDS = 13  # int64 fields per parameter of modulelens_param_before (see moments.c)


def param_before_cpu(records: list[int], count: int) -> list[float]:
    """4 doubles per parameter (sum of squares of the weight, of its gradient and of its update sample,
    rows zero here and before) from :data:`PARAM_FIELDS` fields per parameter (see moments.c). The
    caller has checked :func:`available` and that every pointer is valid for the sizes given."""
    rec = array.array("q", records)
    out = array.array("d", bytes(32 * count))
    if _state["param_before"](count, rec.buffer_info()[0], out.buffer_info()[0]) != 0:  # type: ignore[operator]
        raise ValueError("a parameter's dtype is not float32, float64 or bfloat16")
    return out.tolist()


def param_after_cpu(records: list[int], count: int) -> list[float]:
    """sum((w - copy)^2) per parameter from 6 fields per parameter (see moments.c)."""
    rec = array.array("q", records)
    out = array.array("d", bytes(8 * count))
    if _state["param_after"](count, rec.buffer_info()[0], out.buffer_info()[0]) != 0:  # type: ignore[operator]
        raise ValueError("a parameter's dtype is not float32, float64 or bfloat16")
    return out.tolist()
