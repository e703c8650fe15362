"""Softmax backward family: ``aten._softmax_backward_data.default(grad_output, output, dim,
input_dtype) -> grad_input`` over the last dimension, what autograd runs for ``_softmax`` and
``_safe_softmax`` in a backward pass: ``grad_input = output * (grad_output - sum(grad_output *
output))`` per row.

grad_output, output and the result share one dtype here (the half-to-float case is not covered).
Every dimension of contiguous operands may vary (one size shared by both operands per dimension;
see :mod:`modulelens.kernels.shape_rules`). CPU: per row, the dot product accumulated in double,
then one pass for the result; rows in parallel above the grain. Triton: one program per row (one
block up to 16384 columns, else looped). CUDA: one thread block per row.
"""

from __future__ import annotations

from typing import Any

from modulelens.kernels.shape_rules import ShapeRule
from modulelens.kernels.templates.call import Call, NoMatch, TArg, contiguous_strides, require_same_device
from modulelens.kernels.templates.cpp import ATEN_DTYPE, CPP_PRELUDE, CPP_SCALAR, cpp_checks, cpp_header, cpp_signature
from modulelens.kernels.templates.cuda import CUDA_PRELUDE, CUDA_SCALAR
from modulelens.kernels.templates.loops import next_pow2
from modulelens.kernels.templates.softmax import row_rule
from modulelens.kernels.templates.triton import TORCH_DTYPE, TRITON_PRELUDE, py_checks, py_header, py_signature

FAMILY = "softmax_backward"
OPS = ("aten._softmax_backward_data.default",)
BACKENDS = ("cpp", "triton", "cuda")
ROW_MAX = 16384


def match(call: Call) -> dict[str, Any]:
    require_same_device(call)
    g, y, dim = call.arg("grad_output"), call.arg("output"), call.arg("dim")
    if not isinstance(g, TArg) or not isinstance(y, TArg):
        raise NoMatch("grad_output and output must be tensors")
    if g.shape != y.shape or g.ndim == 0 or g.numel == 0:
        raise NoMatch(f"grad_output {list(g.shape)} and output {list(y.shape)}")
    if not isinstance(dim, int) or dim % g.ndim != g.ndim - 1:
        raise NoMatch(f"softmax backward over dim {dim} (templates cover the last dimension)")
    out = call.outputs[0] if call.outputs else None
    if out is None or out.shape != g.shape or not (g.dtype == y.dtype == out.dtype):
        raise NoMatch("grad_output, output and grad_input of one dtype and shape")
    dense = all(t.contiguous and tuple(t.stride) == contiguous_strides(t.shape) for t in (g, y, out))
    if not dense:
        raise NoMatch("non-contiguous operands (templates take contiguous ones)")
    c = g.shape[-1]
    return {"op": call.op, "rows": g.numel // c, "C": c, "dtype": g.dtype,
            "g": call.param("grad_output"), "y": call.param("output")}


def shape_rule(call: Call, p: dict[str, Any], backend: str, v: dict[str, Any]) -> ShapeRule | None:
    rule = row_rule(call, ["grad_output", "output"], backend, v, ROW_MAX)
    return rule if rule and rule.dims else None


def variants(backend: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    if backend == "cpp":
        return [{"grain": 32768}, {"grain": 8192}, {"grain": 1 << 40}]
    if backend == "triton":
        out = [{"mode": "row", "num_warps": w} for w in (4, 8)] if p["C"] <= ROW_MAX else []
        return out + [{"mode": "loop", "BLOCK": b, "num_warps": w} for b, w in ((1024, 4), (4096, 8))]
    cap = max(32, next_pow2(p["C"]))
    return [{"threads": t} for t in dict.fromkeys(min(t, cap) for t in (256, 128, 512))]


def render_cpp(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    if p["dtype"] not in CPP_SCALAR:
        raise NoMatch(f"the cpp template takes float32 or float64, not {p['dtype']}")
    rule = p.get("rule")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CPP_PRELUDE}
using T = {CPP_SCALAR[p['dtype']]};

{cpp_signature(call, "at::Tensor")} {{
{cpp_checks(call, rule)}
  const int64_t C = {p['g']}.size(-1), ROWS = C > 0 ? {p['g']}.numel() / C : 0;
  at::Tensor out = ml_empty_contiguous({p['g']}.sizes(), {ATEN_DTYPE[p['dtype']]});
  const T* __restrict__ G = {p['g']}.data_ptr<T>();
  const T* __restrict__ Y = {p['y']}.data_ptr<T>();
  T* __restrict__ O = out.data_ptr<T>();
  const int ml_threads = at::get_num_threads();
  #pragma omp parallel for schedule(static) num_threads(ml_threads) if(ROWS > 1 && ROWS * C >= {v['grain']}LL)
  for (int64_t r = 0; r < ROWS; ++r) {{
    const T* __restrict__ gr = G + r * C;
    const T* __restrict__ yr = Y + r * C;
    T* __restrict__ orow = O + r * C;
    double s = 0.0;
    #pragma omp simd reduction(+:s)
    for (int64_t j = 0; j < C; ++j) s += (double)gr[j] * (double)yr[j];
    const T st = (T)s;
    #pragma omp simd
    for (int64_t j = 0; j < C; ++j) orow[j] = yr[j] * (gr[j] - st);
  }}
  return out;
}}
"""


def render_triton(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    rule = p.get("rule")
    if v["mode"] == "row":
        kernel = """
@triton.jit
def _softmax_backward(g_ptr, y_ptr, o_ptr, C: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < C
    g = tl.load(g_ptr + row * C + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row * C + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sum(g * y, axis=0)
    tl.store(o_ptr + row * C + cols, (y * (g - s)).to(o_ptr.dtype.element_ty), mask=mask)
"""
        block = "triton.next_power_of_2(C)"
    else:
        kernel = """
@triton.jit
def _softmax_backward(g_ptr, y_ptr, o_ptr, C: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * C
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        g = tl.load(g_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        acc += g * y
    s = tl.sum(acc, axis=0)
    for start in range(0, C, BLOCK):
        mask = start + cols < C
        g = tl.load(g_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + base + start + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(o_ptr + base + start + cols, (y * (g - s)).to(o_ptr.dtype.element_ty), mask=mask)
"""
        block = str(v["BLOCK"])
    g, y = p["g"], p["y"]
    return (f"{py_header(call, FAMILY, variant, v, rule)}{TRITON_PRELUDE}\n{kernel}\n\n{py_signature(call)}\n"
            f"{py_checks(call, rule=rule)}\n"
            f"    C = {g}.shape[-1]\n"
            f"    out = torch.empty(tuple({g}.shape), dtype={TORCH_DTYPE[p['dtype']]}, device={g}.device)\n"
            f"    _softmax_backward[({g}.numel() // C,)]({g}, {y}, out, C=C, BLOCK={block}, num_warps={v['num_warps']})\n"
            f"    return out\n")


def render_cuda(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    rule, g, y = p.get("rule"), p["g"], p["y"]
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CUDA_PRELUDE}
using scalar_t = {CUDA_SCALAR[p['dtype']]};

__global__ void ml_softmax_backward(const scalar_t* __restrict__ g, const scalar_t* __restrict__ y,
                                    scalar_t* __restrict__ o, int64_t C) {{
  const int64_t row = blockIdx.x;
  const scalar_t* __restrict__ gr = g + row * C;
  const scalar_t* __restrict__ yr = y + row * C;
  scalar_t* __restrict__ orow = o + row * C;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += static_cast<float>(gr[j]) * static_cast<float>(yr[j]);
  s = ml_block_allreduce(s, MlSum(), 0.0f);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    orow[j] = static_cast<scalar_t>(static_cast<float>(yr[j]) * (static_cast<float>(gr[j]) - s));
}}

{cpp_signature(call, "at::Tensor", cuda=True)} {{
{cpp_checks(call, rule)}
  const c10::cuda::CUDAGuard guard({g}.device());
  const int64_t C = {g}.size(-1), ROWS = C > 0 ? {g}.numel() / C : 0;
  at::Tensor out = at::empty_strided({g}.sizes(), ml_contiguous_strides({g}.sizes()), {g}.options());
  if (ROWS == 0) return out;
  ml_softmax_backward<<<(unsigned)ROWS, {int(v['threads'])}, 0, c10::cuda::getCurrentCUDAStream()>>>(
      {g}.data_ptr<scalar_t>(), {y}.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), C);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}}
"""
