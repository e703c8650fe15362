"""Layer norm family: ``aten.native_layer_norm.default(x, normalized_shape, weight?, bias?, eps)
-> (out, mean, rstd)``; mean and rstd have shape ``x.shape[:-k] + [1] * k`` (k =
``len(normalized_shape)``) and the dtype eager gives them (float32 for float16/bfloat16 inputs on
CUDA), both read from the card's output spec.

The leading dimensions of a contiguous input may vary (the shape rule the kernels declare, see
:mod:`modulelens.kernels.shape_rules`): the row count and the output sizes are read at run time;
the normalized dimensions, the weights, dtypes and eps stay as validated.

CPU: per row, mean and the centred sum of squares accumulated in double (two passes over a row
that stays in L1), ``rstd = 1 / sqrt(var + eps)``, then ``(x - mean) * rstd * w + b`` (centred
first, so a constant row gives exactly ``b``; a row holding an infinity gives a NaN mean, as eager's, in both backends); rows in parallel above the grain. Triton: one program per row (looped above
16384 columns). CUDA: one thread block per row.
"""

from __future__ import annotations

from typing import Any

from modulelens.kernels.shape_rules import ShapeRule, VariableDim
from modulelens.kernels.templates.call import (
    Call,
    NoMatch,
    TArg,
    dense_operands,
    require_same_device,
    trailing_size,
)
from modulelens.kernels.templates.cpp import (
    ATEN_DTYPE,
    CPP_PRELUDE,
    CPP_SCALAR,
    cpp_checks,
    cpp_header,
    cpp_literal,
    cpp_signature,
)
from modulelens.kernels.templates.cuda import CUDA_PRELUDE, CUDA_SCALAR
from modulelens.kernels.templates.loops import next_pow2
from modulelens.kernels.templates.triton import (
    TORCH_DTYPE,
    TRITON_PRELUDE,
    py_checks,
    py_header,
    py_literal,
    py_signature,
)

FAMILY = "layer_norm"
OPS = ("aten.native_layer_norm.default",)
BACKENDS = ("cpp", "triton", "cuda")
ROW_MAX = 16384


def match(call: Call) -> dict[str, Any]:
    require_same_device(call)
    x, ns = call.arg("input"), call.arg("normalized_shape")
    w, b, eps = call.arg("weight"), call.arg("bias"), call.arg("eps")
    c = trailing_size(x, ns)
    for name, t in (("weight", w), ("bias", b)):
        if t is not None and (not isinstance(t, TArg) or list(t.shape) != list(ns) or t.dtype != x.dtype):
            raise NoMatch(f"{name} must be None or a {x.dtype} tensor of shape {ns}")
    if len(call.outputs) != 3:
        raise NoMatch("expected (out, mean, rstd)")
    out, mean, rstd = call.outputs
    if out.dtype != x.dtype or mean.dtype != rstd.dtype:
        raise NoMatch("unexpected output dtypes")
    return {"op": call.op, "rows": x.numel // c, "C": c, "eps": float(eps), "shape": list(x.shape),
            "stat_shape": list(mean.shape), "dtype": x.dtype, "stat_dtype": mean.dtype, "has_weight": w is not None,
            "has_bias": b is not None, "contiguous": [t.contiguous for t in (x, w, b) if t is not None],
            "x": call.param("input"), "w": call.param("weight"), "b": call.param("bias"), "k": len(ns)}


def shape_rule(call: Call, p: dict[str, Any], backend: str, v: dict[str, Any]) -> ShapeRule | None:
    """Each leading dimension of a contiguous input varies on its own (rows are independent)."""
    x = call.arg("input")
    lead = x.ndim - p["k"]
    if not x.contiguous or lead < 1:
        return None
    pos = call.schema_names.index("input")
    return ShapeRule(dims=[VariableDim(at=[(pos, d)]) for d in range(lead)])


def variants(backend: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    if backend == "cpp":
        return [{"grain": 32768}, {"grain": 8192}, {"grain": 1 << 40}, {"grain": 32768, "stats": "onepass"}]
    if backend == "triton":
        out = [{"mode": "row", "num_warps": w} for w in (4, 8, 2)] if p["C"] <= ROW_MAX else []
        return out + [{"mode": "loop", "BLOCK": b, "num_warps": w} for b, w in ((1024, 4), (4096, 8))]
    cap = max(32, next_pow2(p["C"]))
    return [{"threads": t} for t in dict.fromkeys(min(t, cap) for t in (256, 128, 512, 1024))]


def render_cpp(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    if p["stat_dtype"] != p["dtype"]:
        raise NoMatch("the cpp template keeps mean and rstd in the input dtype")
    T = CPP_SCALAR[p["dtype"]]
    dt = ATEN_DTYPE[p["dtype"]]
    x, w, b = p["x"], p["w"], p["b"]
    hw, hb = p["has_weight"], p["has_bias"]
    xs, ws, bs = dense_operands([x, w if hw else None, b if hb else None], p["contiguous"])
    # centred first: a constant row gives exactly 0 (x * rs + shift would be contracted into an FMA)
    affine = "((xr[j] - mt) * rs)" + (" * W[j]" if hw else "") + (" + B[j]" if hb else "")
    if v.get("stats") == "onepass":  # sum and sum of squares in one pass (double: no cancellation trouble
        stats = """\
    double s = 0.0, q = 0.0;
    #pragma omp simd reduction(+:s, q)
    for (int64_t j = 0; j < C; ++j) { const double d = (double)xr[j]; s += d; q += d * d; }
    const double mu = std::isfinite(s) ? s / C : NAN;  // as eager's Welford: an infinity makes NaN
    const double var = std::isnan(mu) ? mu : (q / C - mu * mu > 0.0 ? q / C - mu * mu : 0.0);"""
    else:  # two passes: the mean, then the centred sum of squares
        stats = """\
    double s = 0.0;
    #pragma omp simd reduction(+:s)
    for (int64_t j = 0; j < C; ++j) s += (double)xr[j];
    const double mu = std::isfinite(s) ? s / C : NAN;  // as eager's Welford: an infinity makes NaN
    double q = 0.0;
    #pragma omp simd reduction(+:q)
    for (int64_t j = 0; j < C; ++j) { const double d = (double)xr[j] - mu; q += d * d; }
    const double var = q / C;"""
    rule = p.get("rule")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CPP_PRELUDE}
using T = {T};
constexpr int64_t C = {p['C']}, K = {p['k']};
constexpr double EPS = {cpp_literal(p['eps'], 'double')};

{cpp_signature(call, "std::tuple<at::Tensor, at::Tensor, at::Tensor>")} {{
{cpp_checks(call, rule)}
  const at::Tensor xc = {xs};
{f'  const at::Tensor wc = {ws};' if hw else ''}
{f'  const at::Tensor bc = {bs};' if hb else ''}
  const int64_t ROWS = xc.numel() / C;
  const std::vector<int64_t> stat = ml_stat_shape(xc, K);
  at::Tensor out = ml_empty_contiguous(xc.sizes(), {dt});
  at::Tensor mean = ml_empty_contiguous(stat, {dt});
  at::Tensor rstd = ml_empty_contiguous(stat, {dt});
  const T* __restrict__ X = xc.data_ptr<T>();
{'  const T* __restrict__ W = wc.data_ptr<T>();' if hw else ''}
{'  const T* __restrict__ B = bc.data_ptr<T>();' if hb else ''}
  T* __restrict__ Y = out.data_ptr<T>();
  T* __restrict__ M = mean.data_ptr<T>();
  T* __restrict__ R = rstd.data_ptr<T>();
  const int ml_threads = at::get_num_threads();
  #pragma omp parallel for schedule(static) num_threads(ml_threads) if(ROWS > 1 && ROWS * C >= {v['grain']}LL)
  for (int64_t r = 0; r < ROWS; ++r) {{
    const T* __restrict__ xr = X + r * C;
    T* __restrict__ yr = Y + r * C;
{stats}
    const double rstd_d = 1.0 / std::sqrt(var + EPS);
    const T rs = (T)rstd_d, mt = (T)mu;
    M[r] = (T)mu;
    R[r] = rs;
    #pragma omp simd
    for (int64_t j = 0; j < C; ++j) yr[j] = {affine};
  }}
  return std::make_tuple(out, mean, rstd);
}}
"""


def _triton_common(call: Call, p: dict[str, Any]) -> tuple[str, str, str]:
    x, w, b = p["x"], p["w"], p["b"]
    xs, ws, bs = dense_operands([x, w if p["has_weight"] else None, b if p["has_bias"] else None], p["contiguous"])
    lines = [f"    {local} = {expr}" for local, expr in (("x", xs), ("w", ws), ("b", bs)) if expr is not None]
    wa = "w" if p["has_weight"] else "x"
    ba = "b" if p["has_bias"] else "x"
    return "\n".join(lines) + "\n", wa, ba


def render_triton(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    c, rule = p["C"], p.get("rule")
    pid = "tl.program_id(0).to(tl.int64)" if rule or p["rows"] * c >= 2**31 else "tl.program_id(0)"
    prep, wa, ba = _triton_common(call, p)
    if v["mode"] == "row":
        kernel = f"""
@triton.jit
def _layer_norm(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, eps, C: tl.constexpr, BLOCK: tl.constexpr,
                HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    row = {pid}
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=mask, other=0.0).to(tl.float32)
    mean = (tl.sum(x, axis=0) + tl.sum(x - x, axis=0)) / C  # x - x: NaN for an infinity, as eager's mean
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / C
    rstd = 1.0 / tl.sqrt(var + eps)
    y = d * rstd
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * C + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean.to(mean_ptr.dtype.element_ty))
    tl.store(rstd_ptr + row, rstd.to(rstd_ptr.dtype.element_ty))
"""
        block = next_pow2(c)
    else:
        kernel = f"""
@triton.jit
def _layer_norm(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, eps, C: tl.constexpr, BLOCK: tl.constexpr,
                HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    row = {pid}
    base = row * C
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        acc += (x - x) + x  # x - x: NaN for an infinity, so the mean is NaN as eager's
    mean = tl.sum(acc, axis=0) / C
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - mean, 0.0)
        acc += d * d
    var = tl.sum(acc, axis=0) / C
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean.to(mean_ptr.dtype.element_ty))
    tl.store(rstd_ptr + row, rstd.to(rstd_ptr.dtype.element_ty))
"""
        block = v["BLOCK"]
    dt, st = TORCH_DTYPE[p["dtype"]], TORCH_DTYPE[p["stat_dtype"]]
    return f"""{py_header(call, FAMILY, variant, v, rule)}{TRITON_PRELUDE}
{kernel}

{py_signature(call)}
{py_checks(call, rule=rule)}
{prep}    rows = x.numel() // {c}
    stat = tuple(x.shape[:-{p['k']}]) + (1,) * {p['k']}
    out = torch.empty(tuple(x.shape), dtype={dt}, device=x.device)
    mean = torch.empty(stat, dtype={st}, device=x.device)
    rstd = torch.empty(stat, dtype={st}, device=x.device)
    _layer_norm[(rows,)](x, {wa}, {ba}, out, mean, rstd, {py_literal(p['eps'])}, C={c}, BLOCK={block},
                           HAS_W={p['has_weight']}, HAS_B={p['has_bias']}, num_warps={v['num_warps']})
    return out, mean, rstd
"""


def render_cuda(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    x, w, b = p["x"], p["w"], p["b"]
    hw, hb = p["has_weight"], p["has_bias"]
    xs, ws, bs = dense_operands([x, w if hw else None, b if hb else None], p["contiguous"])
    threads = int(v["threads"])
    affine = "(v - mean) * rstd" + (" * static_cast<float>(w[j])" if hw else "") + (" + static_cast<float>(b[j])" if hb else "")
    rule = p.get("rule")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CUDA_PRELUDE}
using scalar_t = {CUDA_SCALAR[p['dtype']]};
using stat_t = {CUDA_SCALAR[p['stat_dtype']]};
constexpr int64_t C = {p['C']}, K = {p['k']};

__global__ void ml_layer_norm(const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
                              const scalar_t* __restrict__ b, scalar_t* __restrict__ y, stat_t* __restrict__ mean_out,
                              stat_t* __restrict__ rstd_out, float eps) {{
  const int64_t row = blockIdx.x;
  const scalar_t* __restrict__ xr = x + row * C;
  scalar_t* __restrict__ yr = y + row * C;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += static_cast<float>(xr[j]);
  const float mean = ml_block_allreduce(s, MlSum(), 0.0f) / C;
  float q = 0.0f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {{
    const float d = static_cast<float>(xr[j]) - mean;
    q += d * d;
  }}
  const float var = ml_block_allreduce(q, MlSum(), 0.0f) / C;
  const float rstd = 1.0f / sqrtf(var + eps);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {{
    const float v = static_cast<float>(xr[j]);
    yr[j] = static_cast<scalar_t>({affine});
  }}
  if (threadIdx.x == 0) {{
    mean_out[row] = static_cast<stat_t>(mean);
    rstd_out[row] = static_cast<stat_t>(rstd);
  }}
}}

{cpp_signature(call, "std::tuple<at::Tensor, at::Tensor, at::Tensor>", cuda=True)} {{
{cpp_checks(call, rule)}
  const c10::cuda::CUDAGuard guard({x}.device());
  const at::Tensor xc = {xs};
{f'  const at::Tensor wc = {ws};' if hw else ''}
{f'  const at::Tensor bc = {bs};' if hb else ''}
  const int64_t ROWS = xc.numel() / C;
  const std::vector<int64_t> stat = ml_stat_shape(xc, K);
  at::Tensor out = at::empty_strided(xc.sizes(), ml_contiguous_strides(xc.sizes()), {x}.options());
  at::Tensor mean = at::empty_strided(stat, ml_contiguous_strides(stat), {x}.options().dtype({ATEN_DTYPE[p['stat_dtype']]}));
  at::Tensor rstd = at::empty_strided(stat, ml_contiguous_strides(stat), {x}.options().dtype({ATEN_DTYPE[p['stat_dtype']]}));
  if (ROWS == 0) return std::make_tuple(out, mean, rstd);
  ml_layer_norm<<<(unsigned)ROWS, {threads}, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<scalar_t>(), {'wc.data_ptr<scalar_t>()' if hw else 'nullptr'}, {'bc.data_ptr<scalar_t>()' if hb else 'nullptr'},
      out.data_ptr<scalar_t>(), mean.data_ptr<stat_t>(), rstd.data_ptr<stat_t>(), {float(p['eps'])!r}f);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return std::make_tuple(out, mean, rstd);
}}
"""
