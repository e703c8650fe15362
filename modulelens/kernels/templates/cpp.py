"""C++ pieces of the templates, shared by the CPU (cpp) and CUDA templates: entry-point
signatures, literals, the per-input shape/stride/dtype checks, and the CPU prelude and math."""

from __future__ import annotations

import math
from typing import Any

from modulelens.kernels.shape_rules import ShapeRule, declaration
from modulelens.kernels.templates.call import Call, Const, NoMatch, TArg

CPP_SCALAR = {"float32": "float", "float64": "double"}
ATEN_DTYPE = {"float32": "at::kFloat", "float64": "at::kDouble", "float16": "at::kHalf", "bfloat16": "at::kBFloat16"}


def source_header(call: Call, family: str, variant: int, vparams: dict[str, Any], comment: str = "//",
                  rule: ShapeRule | None = None) -> str:
    """Comment lines naming the template and the call it was specialised for, and the shape rule
    it declares (:mod:`modulelens.kernels.shape_rules`) when it takes other sizes."""
    shapes = " ".join(str(list(t.shape)) for t in call.tensors)
    dtypes = ",".join(sorted({t.dtype for t in call.tensors}))
    return (f"{comment} modulelens template: family {family}, variant {variant} {vparams}\n"
            f"{comment} {call.op} {shapes} {dtypes}\n" + (declaration(rule, comment) if rule else ""))


def cpp_header(call: Call, family: str, variant: int, vparams: dict[str, Any], rule: ShapeRule | None = None) -> str:
    return source_header(call, family, variant, vparams, "//", rule)


def checked_shape(call: Call, position: int, rule: ShapeRule | None) -> list[int]:
    """The shape the entry point checks argument ``position`` against: -1 for the dimensions the
    rule lets vary (any size, the tensor contiguous), the validated size elsewhere."""
    shape = list(call.values[position].shape)
    for d in rule.dims if rule else []:
        for a, dim in d.at:
            if a == position:
                shape[dim] = -1
    return shape


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


def cpp_leading_shape(tensor: str, k: int, tail: list[int]) -> str:
    """The C++ expression of a shape made of ``tensor``'s first ``k`` sizes at run time, then ``tail``."""
    return (f"[&] {{ std::vector<int64_t> s({tensor}.sizes().begin(), {tensor}.sizes().begin() + {k}); "
            f"for (int64_t t : std::vector<int64_t>{ilist(tail)}) s.push_back(t); return s; }}()")


def cpp_checks(call: Call, rule: ShapeRule | None = None) -> str:
    """``ml_check`` of every tensor parameter (the CPU and CUDA preludes both define it); the
    dimensions ``rule`` lets vary are checked as -1 (any size, tensor contiguous)."""
    lines = []
    for i, (n, v) in enumerate(zip(call.names, call.values)):
        if isinstance(v, TArg):
            shape = "{" + ", ".join(str(x) for x in checked_shape(call, i, rule)) + "}"
            lines.append(f'  ml_check({n}, "{n}", {shape}, {ilist(v.stride)}, {ATEN_DTYPE[v.dtype]});')
    return "\n".join(lines)


# The input check both preludes share, for ``{DEVICE_TEST}`` and ``{DEVICE}``: a shape entry of -1
# is a dimension a shape rule lets vary (any size; the tensor must then be contiguous); the others
# must equal the validated sizes, and the strides of dimensions longer than 1 the validated ones.
ML_CHECK = """\
// Inputs must have the dtype and device the kernel was written for, and the shape and strides (of
// dimensions longer than 1) it was specialised for; -1 in the shape: any size (then contiguous).
static void ml_check(const at::Tensor& t, const char* name, at::IntArrayRef shape, at::IntArrayRef stride,
                     at::ScalarType dtype) {
  TORCH_CHECK({DEVICE_TEST}, name, ": this kernel takes {DEVICE} tensors, got ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, name, ": this kernel takes ", dtype, ", got ", t.scalar_type());
  bool ok = t.dim() == (int64_t)shape.size(), variable = false;
  for (size_t d = 0; ok && d < shape.size(); ++d) {
    variable |= shape[d] < 0;
    ok = shape[d] < 0 || t.size(d) == shape[d];
  }
  if (ok && variable) ok = t.is_contiguous();
  for (size_t d = 0; ok && !variable && d < shape.size(); ++d) ok = shape[d] == 1 || t.stride(d) == stride[d];
  TORCH_CHECK(ok, name, ": this kernel is specialised for shape ", shape, " (-1: any size, contiguous) and strides ",
              stride, ", got ", t.sizes(), " and ", t.strides());
}
"""

# Sizes computed at run time (kernels that take the sizes a shape rule lets vary), both preludes.
ML_SHAPES = """\
// The strides of a contiguous tensor of the given sizes.
static inline std::vector<int64_t> ml_contiguous_strides(at::IntArrayRef shape) {
  std::vector<int64_t> stride(shape.size());
  int64_t acc = 1;
  for (int64_t d = (int64_t)shape.size() - 1; d >= 0; --d) {
    stride[d] = acc;
    acc *= shape[d] > 1 ? shape[d] : 1;
  }
  return stride;
}

// The sizes of a row statistic (mean, rstd) of x over its last k dimensions: x's sizes, the last k set to 1.
static inline std::vector<int64_t> ml_stat_shape(const at::Tensor& x, int64_t k) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  for (int64_t d = (int64_t)s.size() - k; d < (int64_t)s.size(); ++d) s[d] = 1;
  return s;
}
"""

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

ML_CHECK_BODY
ML_SHAPES_BODY
static inline at::Tensor ml_empty(at::IntArrayRef shape, at::IntArrayRef stride, at::ScalarType dtype) {
  return at::Tensor(at::detail::empty_strided_cpu(shape, stride, dtype));
}

static inline at::Tensor ml_empty_contiguous(at::IntArrayRef shape, at::ScalarType dtype) {
  return ml_empty(shape, ml_contiguous_strides(shape), dtype);
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
CPP_PRELUDE = (CPP_PRELUDE.replace("ML_CHECK_BODY", ML_CHECK.replace("{DEVICE_TEST}", "t.device().is_cpu()")
                                   .replace("{DEVICE}", "CPU")).replace("ML_SHAPES_BODY", ML_SHAPES))


def cpp_parallel(cond: str) -> str:
    """An OpenMP parallel-for pragma that uses torch's thread count, when ``cond`` holds."""
    return f"#pragma omp parallel for schedule(static) num_threads(ml_threads) if({cond})"
