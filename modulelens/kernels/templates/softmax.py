"""Softmax family: ``aten._softmax.default(x, dim, half_to_float)`` and
``aten._safe_softmax.default(x, dim, dtype=None)`` over the last dimension.

``_safe_softmax`` gives 0 for rows that are all ``-inf`` (``_softmax`` gives NaN there); rows
holding a NaN are NaN in both, like eager. CPU: one pass for the maximum, one for exp and the sum
(accumulated in double), one to scale; rows in parallel above the grain. Triton: one program per
row (the row in one block up to 16384 columns, else looped with an online maximum). CUDA: one
thread block per row with warp-shuffle reductions.

Every dimension of a contiguous input may vary (the shape rule the kernels declare, see
:mod:`modulelens.kernels.shape_rules`): rows and row length are read at run time (the triton row
variant only up to the widest row one block holds).
"""

from __future__ import annotations

from typing import Any

from modulelens.kernels.shape_rules import ShapeRule, VariableDim
from modulelens.kernels.templates.call import Call, NoMatch, TArg, contiguous_strides, dense, require_same_device
from modulelens.kernels.templates.cpp import (
    ATEN_DTYPE,
    CPP_MATH,
    CPP_PRELUDE,
    CPP_SCALAR,
    cpp_checks,
    cpp_header,
    cpp_signature,
    ilist,
)
from modulelens.kernels.templates.cuda import CUDA_PRELUDE, CUDA_SCALAR
from modulelens.kernels.templates.loops import next_pow2
from modulelens.kernels.templates.triton import (
    TORCH_DTYPE,
    TRITON_PRELUDE,
    py_checks,
    py_header,
    py_return,
    py_signature,
)

FAMILY = "softmax"
OPS = ("aten._softmax.default", "aten._safe_softmax.default")
BACKENDS = ("cpp", "triton", "cuda")
ROW_MAX = 16384  # triton: widest row held in one block


def match(call: Call) -> dict[str, Any]:
    require_same_device(call)
    x = call.arg("self")
    if not isinstance(x, TArg):
        raise NoMatch("the input is not a tensor")
    if x.ndim == 0 or x.numel == 0:
        raise NoMatch(f"input of shape {list(x.shape)}")
    dim = call.arg("dim")
    if not isinstance(dim, int) or (dim % x.ndim) != x.ndim - 1:
        raise NoMatch(f"softmax over dim {dim} of a {x.ndim}-d input (templates cover the last dimension)")
    out = call.outputs[0] if call.outputs else None
    if out is None or tuple(out.shape) != tuple(x.shape):
        raise NoMatch("unexpected output")
    safe = call.op == "aten._safe_softmax.default"
    if out.dtype != x.dtype and not (x.dtype in ("float16", "bfloat16") and out.dtype == "float32"):
        raise NoMatch(f"softmax from {x.dtype} to {out.dtype}")
    c = x.shape[-1]
    return {"op": call.op, "safe": safe, "rows": x.numel // c, "C": c, "shape": list(x.shape), "in_dtype": x.dtype,
            "out_dtype": out.dtype, "input_contiguous": x.contiguous, "out_stride": list(out.stride),
            "out_contiguous": tuple(out.stride) == contiguous_strides(out.shape) or out.contiguous, "x": call.param("self")}


def row_rule(call: Call, names: list[str], backend: str, v: dict[str, Any], row_max: int) -> ShapeRule | None:
    """Every dimension of the contiguous tensors ``names`` (of one shape) varies, each size shared
    by all of them; the row length only where the variant takes a row twice as long (plus one)."""
    xs = [call.arg(n) for n in names]
    if not all(isinstance(x, TArg) and x.contiguous for x in xs) or len({x.shape for x in xs}) != 1:
        return None
    pos = [call.schema_names.index(n) for n in names]
    ndim = xs[0].ndim
    last = backend != "triton" or v.get("mode") != "row" or next_pow2(2 * xs[0].shape[-1] + 1) <= row_max
    return ShapeRule(dims=[VariableDim(at=[(a, d) for a in pos]) for d in range(ndim if last else ndim - 1)]) or None


def shape_rule(call: Call, p: dict[str, Any], backend: str, v: dict[str, Any]) -> ShapeRule | None:
    if not p["out_contiguous"]:
        return None
    rule = row_rule(call, ["self"], backend, v, ROW_MAX)
    return rule if rule and rule.dims else None


def variants(backend: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    if backend == "cpp":
        return [{"grain": 32768}, {"grain": 8192}, {"grain": 1 << 40}]
    if backend == "triton":
        out = []
        if p["C"] <= ROW_MAX:
            out += [{"mode": "row", "num_warps": w} for w in (4, 8, 2)]
        out += [{"mode": "loop", "BLOCK": b, "num_warps": w} for b, w in ((1024, 4), (4096, 8))]
        return out
    cap = max(32, next_pow2(p["C"]))
    seen: list[int] = []
    for t in (256, 128, 512, 1024):
        t = min(t, cap)
        if t not in seen:
            seen.append(t)
    return [{"threads": t} for t in seen]


def render_cpp(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    if p["out_dtype"] != p["in_dtype"]:
        raise NoMatch("the cpp template keeps the input dtype")
    T = CPP_SCALAR[p["in_dtype"]]
    x, rule = p["x"], p.get("rule")
    src = dense(x, p["input_contiguous"])
    ret = "out" if p["out_contiguous"] else (
        f"ml_empty({ilist(p['shape'])}, {ilist(p['out_stride'])}, {ATEN_DTYPE[p['out_dtype']]}).copy_(out)")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CPP_PRELUDE}
{CPP_MATH}
using T = {T};
constexpr bool SAFE = {'true' if p['safe'] else 'false'};

{cpp_signature(call, "at::Tensor")} {{
{cpp_checks(call, rule)}
  const at::Tensor xc = {src};
  const int64_t C = xc.size(-1), ROWS = C > 0 ? xc.numel() / C : 0;
  at::Tensor out = ml_empty_contiguous(xc.sizes(), {ATEN_DTYPE[p['out_dtype']]});
  const T* __restrict__ X = xc.data_ptr<T>();
  T* __restrict__ Y = out.data_ptr<T>();
  const int ml_threads = at::get_num_threads();
  #pragma omp parallel for schedule(static) num_threads(ml_threads) if(ROWS > 1 && ROWS * C >= {v['grain']}LL)
  for (int64_t r = 0; r < ROWS; ++r) {{
    const T* __restrict__ xr = X + r * C;
    T* __restrict__ yr = Y + r * C;
    T m = -INFINITY;
    #pragma omp simd reduction(max:m)
    for (int64_t j = 0; j < C; ++j) m = xr[j] > m ? xr[j] : m;
    if (m == -INFINITY) {{  // every element is -inf or NaN
      bool nan = false;
      for (int64_t j = 0; j < C; ++j) nan |= xr[j] != xr[j];
      const T fill = (SAFE && !nan) ? T(0) : T(NAN);
      for (int64_t j = 0; j < C; ++j) yr[j] = fill;
      continue;
    }}
    double s = 0.0;
    #pragma omp simd reduction(+:s)
    for (int64_t j = 0; j < C; ++j) {{
      const T e = ml_exp(xr[j] - m);
      yr[j] = e;
      s += (double)e;
    }}
    const T inv = (T)(1.0 / s);
    #pragma omp simd
    for (int64_t j = 0; j < C; ++j) yr[j] *= inv;
  }}
  return {ret};
}}
"""


def render_triton(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    rows, c, x, rule = p["rows"], p["C"], p["x"], p.get("rule")
    pid = "tl.program_id(0).to(tl.int64)" if rule or rows * c >= 2**31 else "tl.program_id(0)"
    prep = f"    x = {dense(x, p['input_contiguous'])}\n    C = x.shape[-1]\n    rows = x.numel() // C if C else 0\n"
    shape, out_dt = p["shape"], TORCH_DTYPE[p["out_dtype"]]
    finish = py_return("out", p["out_contiguous"], shape, p["out_stride"], p["out_dtype"])
    if v["mode"] == "row":
        kernel = f"""
@triton.jit
def _softmax(x_ptr, y_ptr, C: tl.constexpr, BLOCK: tl.constexpr, SAFE: tl.constexpr):
    row = {pid}
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    x = tl.load(x_ptr + row * C + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.where(mask, tl.exp(x - m), 0.0)
    s = tl.sum(e, axis=0)
    y = e / s
    if SAFE:
        all_neg_inf = tl.sum(tl.where(mask & (x != -float("inf")), 1, 0), axis=0) == 0
        y = tl.where(all_neg_inf, 0.0, y)
    tl.store(y_ptr + row * C + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
"""
        launch = (f"    _softmax[(rows,)](x, out, C=C, BLOCK=triton.next_power_of_2(C), SAFE={p['safe']}, "
                  f"num_warps={v['num_warps']})\n")
    else:
        kernel = f"""
@triton.jit
def _softmax(x_ptr, y_ptr, C: tl.constexpr, BLOCK: tl.constexpr, SAFE: tl.constexpr):
    row = {pid}
    base = row * C
    cols = tl.arange(0, BLOCK)
    m_vec = tl.full((BLOCK,), -float("inf"), tl.float32)
    s_vec = tl.zeros((BLOCK,), tl.float32)
    finite = tl.zeros((BLOCK,), tl.int32)
    nans = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m_vec, x)
        keep = tl.where(m_new == -float("inf"), 0.0, tl.exp(m_vec - m_new))
        add = tl.where(m_new == -float("inf"), 0.0, tl.exp(x - m_new))
        s_vec = s_vec * keep + add
        m_vec = m_new
        finite += tl.where(mask & (x != -float("inf")), 1, 0)
        nans += tl.where(x != x, 1, 0)
    m = tl.max(m_vec, axis=0)
    s = tl.sum(tl.where(m_vec == -float("inf"), 0.0, s_vec * tl.exp(m_vec - m)), axis=0)
    s = tl.where(tl.sum(nans, axis=0) > 0, float("nan"), s)
    all_neg_inf = tl.sum(finite, axis=0) == 0
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        x = tl.load(x_ptr + base + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m) / s
        if SAFE:
            y = tl.where(all_neg_inf, 0.0, y)
        tl.store(y_ptr + base + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
"""
        launch = f"    _softmax[(rows,)](x, out, C=C, BLOCK={v['BLOCK']}, SAFE={p['safe']}, num_warps={v['num_warps']})\n"
    return (f"{py_header(call, FAMILY, variant, v, rule)}{TRITON_PRELUDE}\n{kernel}\n\n{py_signature(call)}\n"
            f"{py_checks(call, rule=rule)}\n{prep}    out = torch.empty(tuple(x.shape), dtype={out_dt}, device=x.device)\n"
            f"{launch}{finish}")


def render_cuda(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    x, rule = p["x"], p.get("rule")
    threads = int(v["threads"])
    src = dense(x, p["input_contiguous"])
    shape = p["shape"]
    ret = "out" if p["out_contiguous"] else (
        f"at::empty_strided({ilist(shape)}, {ilist(p['out_stride'])}, out.options()).copy_(out)")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CUDA_PRELUDE}
using in_t = {CUDA_SCALAR[p['in_dtype']]};
using out_t = {CUDA_SCALAR[p['out_dtype']]};
constexpr bool SAFE = {'true' if p['safe'] else 'false'};

__global__ void ml_softmax(const in_t* __restrict__ x, out_t* __restrict__ y, int64_t C) {{
  const int64_t row = blockIdx.x;
  const in_t* __restrict__ xr = x + row * C;
  out_t* __restrict__ yr = y + row * C;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) m = fmaxf(m, static_cast<float>(xr[j]));
  m = ml_block_allreduce(m, MlMax(), -INFINITY);
  if (m == -INFINITY) {{  // every element is -inf or NaN
    float nan = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) nan = fmaxf(nan, isnan(static_cast<float>(xr[j])) ? 1.0f : 0.0f);
    nan = ml_block_allreduce(nan, MlMax(), 0.0f);
    const float fill = (SAFE && nan == 0.0f) ? 0.0f : NAN;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) yr[j] = static_cast<out_t>(fill);
    return;
  }}
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {{
    const float v = static_cast<float>(xr[j]);
    s += isnan(v) ? v : expf(v - m);
  }}
  s = ml_block_allreduce(s, MlSum(), 0.0f);
  const float inv = 1.0f / s;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) yr[j] = static_cast<out_t>(expf(static_cast<float>(xr[j]) - m) * inv);
}}

{cpp_signature(call, "at::Tensor", cuda=True)} {{
{cpp_checks(call, rule)}
  const c10::cuda::CUDAGuard guard({x}.device());
  const at::Tensor xc = {src};
  const int64_t C = xc.size(-1), ROWS = C > 0 ? xc.numel() / C : 0;
  at::Tensor out = at::empty_strided(xc.sizes(), ml_contiguous_strides(xc.sizes()), {x}.options().dtype({ATEN_DTYPE[p['out_dtype']]}));
  if (ROWS == 0) return {ret};
  ml_softmax<<<(unsigned)ROWS, {threads}, 0, c10::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<in_t>(), out.data_ptr<out_t>(), C);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {ret};
}}
"""
