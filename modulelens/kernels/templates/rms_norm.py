"""RMS norm family: ``aten._fused_rms_norm.default(x, normalized_shape, weight?, eps?) -> (out, rstd)``.

What reaches dispatch in torch 2.13: ``F.rms_norm``/``nn.RMSNorm`` is CompositeImplicit; on CUDA
(and directly callable on CPU) it runs ``aten._fused_rms_norm``, which this family templates. On
CPU eager decomposes it instead (``pow.Tensor_Scalar``, ``mean.dim``, ``add_.Scalar``, ``rsqrt``,
``mul.Tensor`` x2): those cards fall to the reduction and elementwise families.
``eps=None`` means ``torch.finfo(x.dtype).eps``. ``rstd = 1 / sqrt(mean(x^2) + eps)`` has shape
``x.shape[:-k] + [1] * k``; ``out = (x * rstd) * weight``.

The leading dimensions of a contiguous input may vary (the shape rule the kernels declare, see
:mod:`modulelens.kernels.shape_rules`): the row count and the output sizes are read at run time;
the normalized dimensions, the weight, dtypes and eps stay as validated.
"""

from __future__ import annotations

from typing import Any

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
from modulelens.kernels.templates.layer_norm import shape_rule  # noqa: F401 - the same rule: the rows vary
from modulelens.kernels.templates.loops import next_pow2
from modulelens.kernels.templates.triton import (
    TORCH_DTYPE,
    TRITON_PRELUDE,
    py_checks,
    py_header,
    py_literal,
    py_signature,
)

FAMILY = "rms_norm"
OPS = ("aten._fused_rms_norm.default",)
BACKENDS = ("cpp", "triton", "cuda")
ROW_MAX = 16384
FINFO_EPS = {"float32": 1.1920928955078125e-07, "float64": 2.220446049250313e-16, "float16": 0.0009765625,
             "bfloat16": 0.0078125}


def match(call: Call) -> dict[str, Any]:
    require_same_device(call)
    x, ns, w, eps = call.arg("input"), call.arg("normalized_shape"), call.arg("weight"), call.arg("eps")
    c = trailing_size(x, ns)
    if w is not None and (not isinstance(w, TArg) or list(w.shape) != list(ns) or w.dtype != x.dtype):
        raise NoMatch(f"weight must be None or a {x.dtype} tensor of shape {ns}")
    if len(call.outputs) != 2:
        raise NoMatch("expected (out, rstd)")
    out, rstd = call.outputs
    if eps is None:
        eps = FINFO_EPS.get(x.dtype)
        if eps is None:
            raise NoMatch(f"dtype {x.dtype}")
    return {"op": call.op, "rows": x.numel // c, "C": c, "eps": float(eps), "shape": list(x.shape),
            "stat_shape": list(rstd.shape), "dtype": x.dtype, "out_dtype": out.dtype, "stat_dtype": rstd.dtype,
            "has_weight": w is not None, "contiguous": [t.contiguous for t in (x, w) if t is not None],
            "x": call.param("input"), "w": call.param("weight"), "k": len(ns)}


def variants(backend: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    if backend == "cpp":
        return [{"grain": 32768}, {"grain": 8192}, {"grain": 1 << 40}]
    if backend == "triton":
        out = [{"mode": "row", "num_warps": w} for w in (4, 8, 2)] if p["C"] <= ROW_MAX else []
        return out + [{"mode": "loop", "BLOCK": b, "num_warps": w} for b, w in ((1024, 4), (4096, 8))]
    cap = max(32, next_pow2(p["C"]))
    return [{"threads": t} for t in dict.fromkeys(min(t, cap) for t in (256, 128, 512, 1024))]


def render_cpp(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    if not (p["stat_dtype"] == p["out_dtype"] == p["dtype"]):
        raise NoMatch("the cpp template keeps out and rstd in the input dtype")
    T = CPP_SCALAR[p["dtype"]]
    dt = ATEN_DTYPE[p["dtype"]]
    x, w, hw = p["x"], p["w"], p["has_weight"]
    xs, ws = dense_operands([x, w if hw else None], p["contiguous"])
    rule = p.get("rule")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CPP_PRELUDE}
using T = {T};
constexpr int64_t C = {p['C']}, K = {p['k']};
constexpr double EPS = {cpp_literal(p['eps'], 'double')};

{cpp_signature(call, "std::tuple<at::Tensor, at::Tensor>")} {{
{cpp_checks(call, rule)}
  const at::Tensor xc = {xs};
{f'  const at::Tensor wc = {ws};' if hw else ''}
  const int64_t ROWS = xc.numel() / C;
  at::Tensor out = ml_empty_contiguous(xc.sizes(), {dt});
  at::Tensor rstd = ml_empty_contiguous(ml_stat_shape(xc, K), {dt});
  const T* __restrict__ X = xc.data_ptr<T>();
{'  const T* __restrict__ W = wc.data_ptr<T>();' if hw else ''}
  T* __restrict__ Y = out.data_ptr<T>();
  T* __restrict__ R = rstd.data_ptr<T>();
  const int ml_threads = at::get_num_threads();
  #pragma omp parallel for schedule(static) num_threads(ml_threads) if(ROWS > 1 && ROWS * C >= {v['grain']}LL)
  for (int64_t r = 0; r < ROWS; ++r) {{
    const T* __restrict__ xr = X + r * C;
    T* __restrict__ yr = Y + r * C;
    double q = 0.0;
    #pragma omp simd reduction(+:q)
    for (int64_t j = 0; j < C; ++j) q += (double)xr[j] * (double)xr[j];
    const T rs = (T)(1.0 / std::sqrt(q / C + EPS));
    R[r] = rs;
    #pragma omp simd
    for (int64_t j = 0; j < C; ++j) yr[j] = (xr[j] * rs){' * W[j]' if hw else ''};
  }}
  return std::make_tuple(out, rstd);
}}
"""


def render_triton(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    c, rule = p["C"], p.get("rule")
    pid = "tl.program_id(0).to(tl.int64)" if rule or p["rows"] * c >= 2**31 else "tl.program_id(0)"
    xs, ws = dense_operands([p["x"], p["w"] if p["has_weight"] else None], p["contiguous"])
    prep = f"    x = {xs}\n" + (f"    w = {ws}\n" if ws is not None else "")
    wa = "w" if p["has_weight"] else "x"
    if v["mode"] == "row":
        block = next_pow2(c)
        kernel = f"""
@triton.jit
def _rms_norm(x_ptr, w_ptr, y_ptr, rstd_ptr, eps, C: tl.constexpr, BLOCK: tl.constexpr, HAS_W: tl.constexpr):
    row = {pid}
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
    y = x * rstd
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * C + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd.to(rstd_ptr.dtype.element_ty))
"""
    else:
        block = v["BLOCK"]
        kernel = f"""
@triton.jit
def _rms_norm(x_ptr, w_ptr, y_ptr, rstd_ptr, eps, C: tl.constexpr, BLOCK: tl.constexpr, HAS_W: tl.constexpr):
    row = {pid}
    base = row * C
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / C + eps)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        y = tl.load(x_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd.to(rstd_ptr.dtype.element_ty))
"""
    return f"""{py_header(call, FAMILY, variant, v, rule)}{TRITON_PRELUDE}
{kernel}

{py_signature(call)}
{py_checks(call, rule=rule)}
{prep}    rows = x.numel() // {c}
    out = torch.empty(tuple(x.shape), dtype={TORCH_DTYPE[p['out_dtype']]}, device=x.device)
    rstd = torch.empty(tuple(x.shape[:-{p['k']}]) + (1,) * {p['k']}, dtype={TORCH_DTYPE[p['stat_dtype']]}, device=x.device)
    _rms_norm[(rows,)](x, {wa}, out, rstd, {py_literal(p['eps'])}, C={c}, BLOCK={block}, HAS_W={p['has_weight']},
                         num_warps={v['num_warps']})
    return out, rstd
"""


def render_cuda(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    x, w, hw = p["x"], p["w"], p["has_weight"]
    xs, ws = dense_operands([x, w if hw else None], p["contiguous"])
    rule = p.get("rule")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CUDA_PRELUDE}
using scalar_t = {CUDA_SCALAR[p['dtype']]};
using out_t = {CUDA_SCALAR[p['out_dtype']]};
using stat_t = {CUDA_SCALAR[p['stat_dtype']]};
constexpr int64_t C = {p['C']}, K = {p['k']};

__global__ void ml_rms_norm(const scalar_t* __restrict__ x, const scalar_t* __restrict__ w, out_t* __restrict__ y,
                            stat_t* __restrict__ rstd_out, float eps) {{
  const int64_t row = blockIdx.x;
  const scalar_t* __restrict__ xr = x + row * C;
  out_t* __restrict__ yr = y + row * C;
  float q = 0.0f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {{
    const float v = static_cast<float>(xr[j]);
    q += v * v;
  }}
  const float rstd = 1.0f / sqrtf(ml_block_allreduce(q, MlSum(), 0.0f) / C + eps);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    yr[j] = static_cast<out_t>(static_cast<float>(xr[j]) * rstd{' * static_cast<float>(w[j])' if hw else ''});
  if (threadIdx.x == 0) rstd_out[row] = static_cast<stat_t>(rstd);
}}

{cpp_signature(call, "std::tuple<at::Tensor, at::Tensor>", cuda=True)} {{
{cpp_checks(call, rule)}
  const c10::cuda::CUDAGuard guard({x}.device());
  const at::Tensor xc = {xs};
{f'  const at::Tensor wc = {ws};' if hw else ''}
  const int64_t ROWS = xc.numel() / C;
  const std::vector<int64_t> stat = ml_stat_shape(xc, K);
  at::Tensor out = at::empty_strided(xc.sizes(), ml_contiguous_strides(xc.sizes()), {x}.options().dtype({ATEN_DTYPE[p['out_dtype']]}));
  at::Tensor rstd = at::empty_strided(stat, ml_contiguous_strides(stat), {x}.options().dtype({ATEN_DTYPE[p['stat_dtype']]}));
  if (ROWS == 0) return std::make_tuple(out, rstd);
  ml_rms_norm<<<(unsigned)ROWS, {int(v['threads'])}, 0, c10::cuda::getCurrentCUDAStream()>>>(
      xc.data_ptr<scalar_t>(), {'wc.data_ptr<scalar_t>()' if hw else 'nullptr'}, out.data_ptr<out_t>(),
      rstd.data_ptr<stat_t>(), {float(p['eps'])!r}f);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return std::make_tuple(out, rstd);
}}
"""
