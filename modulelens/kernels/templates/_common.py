"""Shared pieces of the template library: the call a card describes, entry-point signatures,
loop nests over strided operands, and the math snippets of each backend."""

from __future__ import annotations

import keyword
import math
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_DTYPES = {
    "cpp": ("float32", "float64"),
    "triton": ("float32", "float16", "bfloat16"),
    "cuda": ("float32", "float16", "bfloat16"),
}
CPP_SCALAR = {"float32": "float", "float64": "double"}
ATEN_DTYPE = {"float32": "at::kFloat", "float64": "at::kDouble", "float16": "at::kHalf", "bfloat16": "at::kBFloat16"}
CUDA_SCALAR = {"float32": "float", "float16": "at::Half", "bfloat16": "at::BFloat16"}
_CPP_KEYWORDS = {"and", "or", "not", "xor", "default", "template", "class", "struct", "union", "new", "delete", "this",
                 "operator", "register", "auto", "char", "int", "long", "short", "float", "double", "signed",
                 "unsigned", "void", "bool", "const", "static", "inline", "return", "if", "else", "for", "while",
                 "do", "switch", "case", "break", "continue", "goto", "namespace", "using", "typename", "friend",
                 "private", "public", "protected", "virtual", "explicit", "mutable", "volatile", "extern", "sizeof"}


class NoMatch(Exception):
    """The card's operator belongs to a family, but its arguments are outside what the template covers."""


@dataclass(frozen=True)
class TArg:
    """A tensor argument or output as the card's sample describes it."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    contiguous: bool
    device: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class Const:
    """A torch constant argument: ``kind`` is ``dtype`` or ``torch`` (memory format, layout)."""

    kind: str
    name: str


@dataclass
class Call:
    op: str
    args: list[Any]
    kwargs: dict[str, Any]
    outputs: list[TArg]
    names: list[str] = field(default_factory=list)  # entry-point parameter names, in order
    schema_names: list[str] = field(default_factory=list)  # aten argument names of the values, in order

    @property
    def values(self) -> list[Any]:
        return [*self.args, *self.kwargs.values()]

    @property
    def tensors(self) -> list[TArg]:
        return [v for v in self.values if isinstance(v, TArg)]

    @property
    def base(self) -> str:
        """``gelu`` for ``aten.gelu.default``."""
        return self.op.split(".")[1]

    def arg(self, name: str, default: Any = None) -> Any:
        if name in self.schema_names:
            return self.values[self.schema_names.index(name)]
        return default

    def param(self, name: str) -> str:
        """The entry point's parameter name for an aten argument name."""
        return self.names[self.schema_names.index(name)]


def decode(spec: Any) -> Any:
    if spec is None or isinstance(spec, (bool, int, float, str)):
        return spec
    if isinstance(spec, dict):
        kind = spec.get("$")
        if kind == "tensor":
            if spec.get("layout"):
                raise NoMatch(f"tensor layout {spec['layout']} (templates take strided tensors)")
            shape = tuple(spec["shape"])
            stride = tuple(spec["stride"]) if spec.get("stride") is not None else _contiguous(shape)
            return TArg(shape, spec["dtype"], stride, bool(spec.get("contiguous", True)), spec.get("device", "cpu"))
        if kind in ("list", "tuple", "size"):
            return [decode(x) for x in spec["items"]]
        if kind == "float":
            return float(spec["v"])
        if kind == "dtype":
            return Const("dtype", spec["name"])
        if kind == "torch":
            return Const("torch", spec["name"])
        if kind == "device":
            return Const("device", spec["v"])
        raise NoMatch(f"argument of kind {kind!r}")
    raise NoMatch(f"argument {spec!r}")


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def contiguous_strides(shape) -> tuple[int, ...]:
    return _contiguous(tuple(shape))


def _flat_outputs(value: Any) -> list[TArg]:
    if isinstance(value, TArg):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _flat_outputs(v)]
    return []


def _safe_name(name: str) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "arg"
    if name[0].isdigit():
        name = "a" + name
    if keyword.iskeyword(name) or name in _CPP_KEYWORDS:
        name += "_"
    return name


def call_from_card(card: dict[str, Any]) -> Call:
    """The call of the card's first stored sample: positional args, then keyword args in stored order."""
    samples = card.get("samples") or []
    if not samples:
        raise NoMatch("the card has no stored sample to take the call's structure from")
    s = samples[0]
    args = decode(s["args"])
    kwargs_spec = s.get("kwargs") or {"$": "dict", "items": []}
    kwargs = {k: decode(v) for k, v in (kwargs_spec.get("items") or [])} if isinstance(kwargs_spec, dict) else {}
    outputs = _flat_outputs(decode(s.get("output")))
    schema_names = _schema_names(card["op"], len(args)) + list(kwargs)
    names, seen = [], set()
    for n in schema_names:
        n = _safe_name(n)
        while n in seen:
            n += "_"
        seen.add(n)
        names.append(n)
    return Call(op=card["op"], args=list(args), kwargs=kwargs, outputs=outputs, names=names, schema_names=schema_names)


def _schema_names(op: str, n: int) -> list[str]:
    try:
        from modulelens.ops.recorder import resolve_op

        arguments = resolve_op(op)._schema.arguments
        names = [a.name for a in arguments[:n]]
    except (AttributeError, RuntimeError, ValueError):
        names = []
    return names + [f"arg{i}" for i in range(len(names), n)]


# ---------------------------------------------------------------------------------------------
# Signatures

def cpp_type(value: Any, cuda: bool = False) -> str:
    if isinstance(value, TArg):
        return "const at::Tensor&"
    if value is None:
        return "const c10::optional<at::Tensor>&"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64_t"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "std::string"
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "std::vector<int64_t>"
    if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return "std::vector<double>"
    if isinstance(value, Const) and value.kind == "dtype":
        return "at::ScalarType"
    if isinstance(value, Const) and value.kind == "torch" and value.name.endswith("_format"):
        return "at::MemoryFormat"
    if cuda:
        raise NoMatch(f"an argument ({value!r}) the CUDA entry point cannot take as a typed C++ value")
    return "pybind11::object"


def cpp_signature(call: Call, ret: str, cuda: bool = False) -> str:
    params = ", ".join(f"{cpp_type(v, cuda)} {n}" for n, v in zip(call.names, call.values))
    return f"{ret} forward({params})"


def py_signature(call: Call) -> str:
    return f"def forward({', '.join(call.names)}):"


def cpp_literal(x: float | int, ctype: str) -> str:
    if isinstance(x, bool):
        x = int(x)
    if isinstance(x, float) and not math.isfinite(x):
        inner = "NAN" if math.isnan(x) else ("INFINITY" if x > 0 else "-INFINITY")
        return f"static_cast<{ctype}>({inner})"
    return f"static_cast<{ctype}>({float(x)!r})"


def py_literal(x: float | int) -> str:
    x = float(x)
    if math.isnan(x):
        return 'float("nan")'
    if math.isinf(x):
        return 'float("inf")' if x > 0 else 'float("-inf")'
    return repr(x)


def ilist(xs) -> str:
    return "{" + ", ".join(str(int(x)) for x in xs) + "}"


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# ---------------------------------------------------------------------------------------------
# Loop nests over (possibly broadcast, possibly strided) operands

def broadcast_strides(t: TArg, out_shape: tuple[int, ...]) -> list[int]:
    nd, pad = len(out_shape), len(out_shape) - t.ndim
    if pad < 0:
        raise NoMatch(f"operand of shape {list(t.shape)} does not broadcast to {list(out_shape)}")
    strides = []
    for d in range(nd):
        if d < pad:
            strides.append(0)
            continue
        size, stride = t.shape[d - pad], t.stride[d - pad]
        if size == out_shape[d]:
            strides.append(stride if size != 1 else 0)
        elif size == 1:
            strides.append(0)
        else:
            raise NoMatch(f"operand of shape {list(t.shape)} does not broadcast to {list(out_shape)}")
    return strides


def loop_nest(out: TArg, operand_strides: list[list[int]]) -> list[tuple[int, list[int]]]:
    """Loops (size, [output stride, operand strides...]) from outer to inner, in the output's memory
    order, with adjacent loops merged where every tensor allows it. The output must be dense."""
    nd = out.ndim
    dims = [d for d in range(nd) if out.shape[d] != 1]
    dims.sort(key=lambda d: out.stride[d], reverse=True)
    merged: list[tuple[int, list[int]]] = []
    for d in dims:
        size, st = out.shape[d], [out.stride[d], *[s[d] for s in operand_strides]]
        if merged and all(a == b * size for a, b in zip(merged[-1][1], st)):
            merged[-1] = (merged[-1][0] * size, st)
        else:
            merged.append((size, st))
    if not merged:
        merged = [(1, [1, *[0 for _ in operand_strides]])]
    expect = 1
    for size, st in reversed(merged):
        if st[0] != expect and size > 1:
            raise NoMatch(f"the eager output layout (strides {list(out.stride)}) is not dense")
        expect *= size
    return merged


def offset_terms(loops: list[tuple[int, list[int]]], k: int, index: str, outer_only: bool) -> list[str]:
    """C/Python expressions (one per loop with a non-zero stride) whose sum is operand ``k``'s element
    offset for the linear ``index`` over the loops (all loops, or all but the innermost)."""
    use = loops[:-1] if outer_only else loops
    terms = []
    for j, (size, st) in enumerate(use):
        stride = st[k]
        if stride == 0 or size == 1:
            continue
        inner = math.prod(s for s, _ in use[j + 1:])
        q = index if inner == 1 else f"({index} / {inner})"
        if j > 0:
            q = f"({q} % {size})"
        terms.append(q if stride == 1 else f"{q} * {stride}")
    return terms


# ---------------------------------------------------------------------------------------------
# C++ (CPU) pieces

CPP_PRELUDE = """\
// modulelens: no-implicit-headers
#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

// Inputs must have the shape, strides (of dimensions longer than 1), dtype and device the kernel
// was specialised for.
static void ml_check(const at::Tensor& t, const char* name, at::IntArrayRef shape, at::IntArrayRef stride,
                     at::ScalarType dtype) {
  TORCH_CHECK(t.device().is_cpu(), name, ": this kernel takes CPU tensors, got ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, name, ": this kernel takes ", dtype, ", got ", t.scalar_type());
  bool ok = t.sizes() == shape;
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = shape[d] == 1 || t.stride(d) == stride[d];
  TORCH_CHECK(ok, name, ": this kernel is specialised for shape ", shape, " and strides ", stride, ", got ",
              t.sizes(), " and ", t.strides());
}

static inline at::Tensor ml_empty(at::IntArrayRef shape, at::IntArrayRef stride, at::ScalarType dtype) {
  return at::Tensor(at::detail::empty_strided_cpu(shape, stride, dtype));
}
"""

# Vectorisable float32 math (GCC/Clang turn the loops that call these into SIMD code at -O3).
# ml_exp: Cephes expf polynomial with exponent bits built directly (error <= 2 ulp on [-87, 88]).
# ml_erf: Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), the formula eager's vectorised CPU
#         GELU uses (ATen/cpu/vec Vectorized<float>::erf).
# ml_erf_accurate: Norbert Juffa's erff polynomials (max error about 1 ulp; ~25% slower).
# ml_tanh: Cephes tanhf (polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above).
# float64 uses the C library (scalar, exact to the last bit or so).
CPP_MATH = """\
static inline float ml_exp(float x) {
  float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = (int32_t)n + 127;
  float y = p * __builtin_bit_cast(float, e << 23);
  y = x < -87.0f ? 0.0f : y;
  y = x > 88.0f ? INFINITY : y;
  return x != x ? x : y;
}
static inline float ml_erf(float x) {
  float ax = x < 0.0f ? -x : x;
  float t = 1.0f / (0.3275911f * ax + 1.0f);
  float r = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  float y = 1.0f - r * ml_exp(-x * x);
  return x < 0.0f ? -y : y;
}
static inline float ml_tanh(float x) {
  float ax = x < 0.0f ? -x : x;
  float z = x * x;
  float small = ((((-5.70498872745E-3f * z + 2.06390887954E-2f) * z - 5.37397155531E-2f) * z
                  + 1.33314422036E-1f) * z - 3.33332819422E-1f) * z * x + x;
  float e = ml_exp(2.0f * (ax > 9.0f ? 9.0f : ax));
  float big = 1.0f - 2.0f / (e + 1.0f);
  big = x < 0.0f ? -big : big;
  return ax < 0.625f ? small : big;
}
// Juffa's erff (branch-free here: both halves computed, one selected), max error ~1 ulp.
static inline float ml_erf_accurate(float a) {
  const float t = a < 0.0f ? -a : a, s = a * a;
  float r = -1.72853470e-5f * t + 3.83197126e-4f;
  const float u = -3.88396438e-3f * t + 2.42546219e-2f;
  r = r * s + u;
  r = r * t - 1.06777877e-1f;
  r = r * t - 6.34846687e-1f;
  r = r * t - 1.28717512e-1f;
  r = r * t - t;
  r = 1.0f - ml_exp(r);
  r = a < 0.0f ? -r : r;
  float q = -5.96761703e-4f;
  q = q * s + 4.99119423e-3f;
  q = q * s - 2.67681349e-2f;
  q = q * s + 1.12819925e-1f;
  q = q * s - 3.76125336e-1f;
  q = q * s + 1.28379166e-1f;
  q = q * a + a;
  return t >= 0.927734375f ? r : q;
}
static inline float ml_erf_libm(float x) { return std::erf(x); }
static inline double ml_exp(double x) { return std::exp(x); }
static inline double ml_erf(double x) { return std::erf(x); }
static inline double ml_erf_libm(double x) { return std::erf(x); }
static inline double ml_erf_accurate(double x) { return std::erf(x); }
static inline double ml_tanh(double x) { return std::tanh(x); }
"""


def cpp_header(call: Call, family: str, variant: int, vparams: dict[str, Any]) -> str:
    shapes = " ".join(str(list(t.shape)) for t in call.tensors)
    dtypes = ",".join(sorted({t.dtype for t in call.tensors}))
    return (f"// modulelens template: family {family}, variant {variant} {vparams}\n"
            f"// {call.op} {shapes} {dtypes}\n")


def cpp_checks(call: Call) -> str:
    lines = []
    for n, v in zip(call.names, call.values):
        if isinstance(v, TArg):
            lines.append(f'  ml_check({n}, "{n}", {ilist(v.shape)}, {ilist(v.stride)}, {ATEN_DTYPE[v.dtype]});')
    return "\n".join(lines)


def cpp_parallel(cond: str) -> str:
    """An OpenMP parallel-for pragma that uses torch's thread count, when ``cond`` holds."""
    return f"#pragma omp parallel for schedule(static) num_threads(ml_threads) if({cond})"


# ---------------------------------------------------------------------------------------------
# Triton pieces

TRITON_PRELUDE = """\
import torch
import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    ax = tl.abs(x)
    z = x * x
    small = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
             - 3.33332819422e-1) * z * x + x
    e = tl.exp(2.0 * tl.minimum(ax, 9.0))
    big = 1.0 - 2.0 / (e + 1.0)
    big = tl.where(x < 0, -big, big)
    return tl.where(ax < 0.625, small, big)


def _check(t, name, shape, stride, dtype):
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"{name}: this kernel is specialised for shape {list(shape)} and {dtype}, "
                         f"got {list(t.shape)} and {t.dtype}")
    if any(s != 1 and a != b for s, a, b in zip(shape, t.stride(), stride)):
        raise ValueError(f"{name}: this kernel is specialised for strides {list(stride)}, got {list(t.stride())}")
"""

TORCH_DTYPE = {"float32": "torch.float32", "float16": "torch.float16", "bfloat16": "torch.bfloat16", "float64": "torch.float64"}


def py_checks(call: Call, indent: str = "    ") -> str:
    lines = []
    for n, v in zip(call.names, call.values):
        if isinstance(v, TArg):
            lines.append(f'{indent}_check({n}, "{n}", {list(v.shape)}, {list(v.stride)}, {TORCH_DTYPE[v.dtype]})')
    return "\n".join(lines)


def py_header(call: Call, family: str, variant: int, vparams: dict[str, Any]) -> str:
    shapes = " ".join(str(list(t.shape)) for t in call.tensors)
    dtypes = ",".join(sorted({t.dtype for t in call.tensors}))
    return f"# modulelens template: family {family}, variant {variant} {vparams}\n# {call.op} {shapes} {dtypes}\n"


def py_empty(t: TArg, device_of: str) -> str:
    return f"torch.empty_strided({list(t.shape)}, {list(t.stride)}, dtype={TORCH_DTYPE[t.dtype]}, device={device_of}.device)"


# ---------------------------------------------------------------------------------------------
# CUDA pieces

CUDA_PRELUDE = """\
// modulelens: no-implicit-headers
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Half.h>
#include <c10/util/BFloat16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <tuple>
#include <vector>

static void ml_check(const at::Tensor& t, const char* name, at::IntArrayRef shape, at::IntArrayRef stride,
                     at::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda(), name, ": this kernel takes CUDA tensors, got ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, name, ": this kernel takes ", dtype, ", got ", t.scalar_type());
  bool ok = t.sizes() == shape;
  for (size_t d = 0; ok && d < shape.size(); ++d) ok = shape[d] == 1 || t.stride(d) == stride[d];
  TORCH_CHECK(ok, name, ": this kernel is specialised for shape ", shape, " and strides ", stride, ", got ",
              t.sizes(), " and ", t.strides());
}

struct MlSum { __device__ __forceinline__ float operator()(float a, float b) const { return a + b; } };
struct MlMax { __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); } };

// All threads of the block get the reduction of v (blockDim.x a multiple of 32, at most 1024).
template <typename Op>
__device__ __forceinline__ float ml_block_allreduce(float v, Op op, float init) {
  __shared__ float shm[33];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) shm[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float w = lane < nw ? shm[lane] : init;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) w = op(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (lane == 0) shm[32] = w;
  }
  __syncthreads();
  return shm[32];
}
"""


def cuda_checks(call: Call) -> str:
    lines = []
    for n, v in zip(call.names, call.values):
        if isinstance(v, TArg):
            lines.append(f'  ml_check({n}, "{n}", {ilist(v.shape)}, {ilist(v.stride)}, {ATEN_DTYPE[v.dtype]});')
    return "\n".join(lines)


def cuda_empty(t: TArg, like: str) -> str:
    return f"at::empty_strided({ilist(t.shape)}, {ilist(t.stride)}, {like}.options().dtype({ATEN_DTYPE[t.dtype]}))"


def require_same_device(call: Call) -> None:
    devices = {t.device.split(":")[0] for t in call.tensors}
    if len(devices) > 1:
        raise NoMatch(f"tensors on different devices ({', '.join(sorted(devices))})")


def require_dense_layout(t: TArg, what: str = "input") -> None:
    if t.numel == 0:
        raise NoMatch(f"empty {what} (shape {list(t.shape)})")


def jsonable(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        if isinstance(v, tuple):
            v = list(v)
        if isinstance(v, list):
            v = [list(x) if isinstance(x, tuple) else x for x in v]
        out[k] = v
    return out
