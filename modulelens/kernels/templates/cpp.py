"""C++ pieces of the templates, shared by the CPU (cpp) and CUDA templates: entry-point
signatures, literals, the per-input shape/stride/dtype checks, and the CPU prelude and math."""

from __future__ import annotations

import math
from typing import Any

from modulelens.kernels.templates.call import Call, Const, NoMatch, TArg

CPP_SCALAR = {"float32": "float", "float64": "double"}
ATEN_DTYPE = {"float32": "at::kFloat", "float64": "at::kDouble", "float16": "at::kHalf", "bfloat16": "at::kBFloat16"}


def source_header(call: Call, family: str, variant: int, vparams: dict[str, Any], comment: str = "//") -> str:
    """Two comment lines naming the template and the call it was specialised for."""
    shapes = " ".join(str(list(t.shape)) for t in call.tensors)
    dtypes = ",".join(sorted({t.dtype for t in call.tensors}))
    return (f"{comment} modulelens template: family {family}, variant {variant} {vparams}\n"
            f"{comment} {call.op} {shapes} {dtypes}\n")


def cpp_header(call: Call, family: str, variant: int, vparams: dict[str, Any]) -> str:
    return source_header(call, family, variant, vparams, "//")


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


def cpp_literal(x: float | int, ctype: str) -> str:
    if isinstance(x, bool):
        x = int(x)
    if isinstance(x, float) and not math.isfinite(x):
        inner = "NAN" if math.isnan(x) else ("INFINITY" if x > 0 else "-INFINITY")
        return f"static_cast<{ctype}>({inner})"
    return f"static_cast<{ctype}>({float(x)!r})"


def ilist(xs) -> str:
    return "{" + ", ".join(str(int(x)) for x in xs) + "}"


def cpp_checks(call: Call) -> str:
    """``ml_check`` of every tensor parameter (the CPU and CUDA preludes both define it)."""
    lines = []
    for n, v in zip(call.names, call.values):
        if isinstance(v, TArg):
            lines.append(f'  ml_check({n}, "{n}", {ilist(v.shape)}, {ilist(v.stride)}, {ATEN_DTYPE[v.dtype]});')
    return "\n".join(lines)


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


def cpp_parallel(cond: str) -> str:
    """An OpenMP parallel-for pragma that uses torch's thread count, when ``cond`` holds."""
    return f"#pragma omp parallel for schedule(static) num_threads(ml_threads) if({cond})"
