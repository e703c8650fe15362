"""Reduction family: ``aten.sum.dim_IntList``, ``aten.mean.dim`` and ``aten.amax.default`` over one
dimension or a run of adjacent dimensions (``dim=[-1]``, ``[1]``, ``[-1, -2]`` (what
``adaptive_avg_pool2d(x, 1)`` becomes), ``[]``/None = all), ``keepdim`` either way.

The input (made contiguous when it is not) is viewed as ``[outer, R, inner]``. CPU: rows
(``inner == 1``) reduce with SIMD reductions, accumulated in double for sum and mean; otherwise
each work item accumulates a strip of up to 512 inner positions over R. ``amax`` propagates NaN
like eager. Triton: one program per (outer, strip of inner), tiles of ``[BLOCK_R, BLOCK_I]``.
No CUDA template.

The dimensions before the reduced ones of a contiguous input may vary, when the output is
contiguous (the shape rule the kernels declare, see :mod:`modulelens.kernels.shape_rules`): the
outer count and the output's leading sizes are read at run time; the reduced and inner dimensions
stay as validated.
"""

from __future__ import annotations

import math
from typing import Any

from modulelens.kernels.shape_rules import ShapeRule, VariableDim
from modulelens.kernels.templates.call import Call, Const, NoMatch, TArg, contiguous_strides, dense, require_same_device
from modulelens.kernels.templates.cpp import (
    ATEN_DTYPE,
    CPP_PRELUDE,
    CPP_SCALAR,
    cpp_checks,
    cpp_header,
    cpp_leading_shape,
    cpp_signature,
    ilist,
)
from modulelens.kernels.templates.loops import next_pow2
from modulelens.kernels.templates.triton import (
    TORCH_DTYPE,
    TRITON_PRELUDE,
    py_checks,
    py_header,
    py_return,
    py_signature,
)

FAMILY = "reduction"
OPS = ("aten.sum.dim_IntList", "aten.mean.dim", "aten.amax.default")
BACKENDS = ("cpp", "triton")
KINDS = {"aten.sum.dim_IntList": "sum", "aten.mean.dim": "mean", "aten.amax.default": "amax"}
STRIP = 512


def match(call: Call) -> dict[str, Any]:
    require_same_device(call)
    x, dim = call.arg("self"), call.arg("dim")
    if not isinstance(x, TArg):
        raise NoMatch("the input is not a tensor")
    if x.numel == 0:
        raise NoMatch("empty input")
    dtype = call.arg("dtype")
    if dtype is not None and not (isinstance(dtype, Const) and dtype.name == x.dtype):
        raise NoMatch(f"dtype={dtype!r} (templates keep the input dtype)")
    nd = max(x.ndim, 1)
    dims = list(range(x.ndim)) if dim is None or dim == [] else ([dim] if isinstance(dim, int) else list(dim))
    try:
        dims = sorted({d % nd for d in dims})
    except TypeError:
        raise NoMatch(f"dim={dim!r}") from None
    if x.ndim == 0:
        dims = []
    if dims and dims != list(range(dims[0], dims[-1] + 1)):
        raise NoMatch(f"dims {dims} are not adjacent")
    shape = list(x.shape)
    d0, d1 = (dims[0], dims[-1]) if dims else (0, -1)
    outer, r, inner = math.prod(shape[:d0]), math.prod(shape[d0:d1 + 1]), math.prod(shape[d1 + 1:])
    if not call.outputs or call.outputs[0].dtype != x.dtype:
        raise NoMatch("unexpected output")
    out = call.outputs[0]
    return {"op": call.op, "kind": KINDS[call.op], "dims": dims, "outer": outer, "R": r, "inner": inner,
            "shape": shape, "out_shape": list(out.shape), "out_stride": list(out.stride),
            "out_contiguous": tuple(out.stride) == contiguous_strides(out.shape), "dtype": x.dtype,
            "input_contiguous": x.contiguous, "x": call.param("self"), "d0": d0 if dims else 0}


def shape_rule(call: Call, p: dict[str, Any], backend: str, v: dict[str, Any]) -> ShapeRule | None:
    """Each dimension before the reduced ones varies on its own (contiguous input and output)."""
    if not (p["input_contiguous"] and p["out_contiguous"]) or p["d0"] < 1:
        return None
    pos = call.schema_names.index("self")
    return ShapeRule(dims=[VariableDim(at=[(pos, d)]) for d in range(p["d0"])])


def _out_shape_cpp(p: dict[str, Any], rule: ShapeRule | None) -> str:
    """The C++ expression of the output's shape: the input's leading sizes at run time under a rule."""
    if rule is None:
        return ilist(p["out_shape"])
    return cpp_leading_shape("xc", p["d0"], p["out_shape"][p["d0"]:])


def variants(backend: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    if backend == "cpp":
        return [{"grain": 32768}, {"grain": 8192}, {"grain": 1 << 40}]
    if p["inner"] == 1:
        return [{"BLOCK_R": b, "num_warps": w} for b, w in ((1024, 4), (4096, 8), (256, 2))]
    return [{"BLOCK_R": b, "num_warps": w} for b, w in ((32, 4), (64, 4), (16, 2))]


def render_cpp(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    T = CPP_SCALAR[p["dtype"]]
    dt = ATEN_DTYPE[p["dtype"]]
    kind, outer, r, inner = p["kind"], p["outer"], p["R"], p["inner"]
    src = dense(p["x"], p["input_contiguous"])
    ret = "out" if p["out_contiguous"] else f"ml_empty({ilist(p['out_shape'])}, {ilist(p['out_stride'])}, {dt}).copy_(out)"
    if kind == "amax":
        row = """\
      T m = -INFINITY;
      int nan = 0;
      #pragma omp simd reduction(max:m) reduction(|:nan)
      for (int64_t k = 0; k < R; ++k) { const T v = xr[k]; m = v > m ? v : m; nan |= v != v; }
      Y[o] = nan ? T(NAN) : m;"""
        strip = """\
      T m[STRIP];
      int nan[STRIP];
      for (int64_t i = 0; i < n; ++i) { m[i] = -INFINITY; nan[i] = 0; }
      for (int64_t k = 0; k < R; ++k) {
        const T* __restrict__ xk = X + (o * R + k) * INNER + i0;
        #pragma omp simd
        for (int64_t i = 0; i < n; ++i) { const T v = xk[i]; m[i] = v > m[i] ? v : m[i]; nan[i] |= v != v; }
      }
      for (int64_t i = 0; i < n; ++i) Y[o * INNER + i0 + i] = nan[i] ? T(NAN) : m[i];"""
    else:
        scale = " / R" if kind == "mean" else ""
        row = f"""\
      double s = 0.0;
      #pragma omp simd reduction(+:s)
      for (int64_t k = 0; k < R; ++k) s += (double)xr[k];
      Y[o] = (T)(s{scale});"""
        strip = f"""\
      double acc[STRIP];
      for (int64_t i = 0; i < n; ++i) acc[i] = 0.0;
      for (int64_t k = 0; k < R; ++k) {{
        const T* __restrict__ xk = X + (o * R + k) * INNER + i0;
        #pragma omp simd
        for (int64_t i = 0; i < n; ++i) acc[i] += (double)xk[i];
      }}
      for (int64_t i = 0; i < n; ++i) Y[o * INNER + i0 + i] = (T)(acc[i]{scale});"""
    if inner == 1:
        body = f"""\
  #pragma omp parallel for schedule(static) num_threads(ml_threads) if(OUTER > 1 && OUTER * R >= {v['grain']}LL)
  for (int64_t o = 0; o < OUTER; ++o) {{
      const T* __restrict__ xr = X + o * R;
{row}
  }}"""
    else:
        body = f"""\
  constexpr int64_t STRIPS = (INNER + STRIP - 1) / STRIP;
  #pragma omp parallel for schedule(static) num_threads(ml_threads) if(OUTER * STRIPS > 1 && OUTER * R * INNER >= {v['grain']}LL)
  for (int64_t w = 0; w < OUTER * STRIPS; ++w) {{
      const int64_t o = w / STRIPS, i0 = (w % STRIPS) * STRIP;
      const int64_t n = INNER - i0 < STRIP ? INNER - i0 : STRIP;
{strip}
  }}"""
    rule = p.get("rule")
    outer_decl = "" if rule else f"OUTER = {outer}, "
    alloc = (f"ml_empty_contiguous({_out_shape_cpp(p, rule)}, {dt})" if rule else
             f"ml_empty({ilist(p['out_shape'])}, {ilist(contiguous_strides(p['out_shape']))}, {dt})")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CPP_PRELUDE}
using T = {T};
constexpr int64_t {outer_decl}R = {r}, INNER = {inner}, STRIP = {STRIP};

{cpp_signature(call, "at::Tensor")} {{
{cpp_checks(call, rule)}
  const at::Tensor xc = {src};
{'  const int64_t OUTER = xc.numel() / (R * INNER);' if rule else ''}
  at::Tensor out = {alloc};
  const T* __restrict__ X = xc.data_ptr<T>();
  T* __restrict__ Y = out.data_ptr<T>();
  const int ml_threads = at::get_num_threads();
  (void)ml_threads;
{body}
  return {ret};
}}
"""


def render_triton(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    outer, r, inner = p["outer"], p["R"], p["inner"]
    block_i = min(next_pow2(inner), 64)
    block_r = min(int(v["BLOCK_R"]), max(1, next_pow2(r)))
    kind = {"sum": 0, "mean": 1, "amax": 2}[p["kind"]]
    rule = p.get("rule")
    wide = rule is not None or outer * r * inner >= 2**31
    src = dense(p["x"], p["input_contiguous"])
    dt = TORCH_DTYPE[p["dtype"]]
    finish = py_return("out", p["out_contiguous"], p["out_shape"], p["out_stride"], p["dtype"])
    out_shape = f"tuple(x.shape[:{p['d0']}]) + {tuple(p['out_shape'][p['d0']:])}" if rule else str(p["out_shape"])
    grid_outer = f"x.numel() // {r * inner}" if rule else str(outer)
    return f"""{py_header(call, FAMILY, variant, v, rule)}{TRITON_PRELUDE}

@triton.jit
def _reduce(x_ptr, y_ptr, R: tl.constexpr, INNER: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
            KIND: tl.constexpr):
    o = tl.program_id(0){'.to(tl.int64)' if wide else ''}
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    imask = i < INNER
    rr = tl.arange(0, BLOCK_R)
    base = o * R * INNER
    if KIND == 2:
        acc = tl.full((BLOCK_R, BLOCK_I), -float("inf"), tl.float32)
    else:
        acc = tl.zeros((BLOCK_R, BLOCK_I), tl.float32)
    nan = tl.zeros((BLOCK_R, BLOCK_I), tl.int32)
    for start in range(0, R, BLOCK_R):
        k = start + rr
        mask = (k[:, None] < R) & imask[None, :]
        ptrs = x_ptr + base + k[:, None] * INNER + i[None, :]
        if KIND == 2:
            v = tl.load(ptrs, mask=mask, other=-float("inf")).to(tl.float32)
            acc = tl.maximum(acc, v)
            nan = nan | tl.where(v != v, 1, 0)
        else:
            v = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            acc += v
    if KIND == 2:
        res = tl.max(acc, axis=0)
        res = tl.where(tl.max(nan, axis=0) > 0, float("nan"), res)
    else:
        res = tl.sum(acc, axis=0)
        if KIND == 1:
            res = res / R
    tl.store(y_ptr + o * INNER + i, res.to(y_ptr.dtype.element_ty), mask=imask)


{py_signature(call)}
{py_checks(call, rule=rule)}
    x = {src}
    out = torch.empty({out_shape}, dtype={dt}, device=x.device)
    _reduce[({grid_outer}, {(inner + block_i - 1) // block_i})](x, out, R={r}, INNER={inner}, BLOCK_R={block_r}, BLOCK_I={block_i},
                                    KIND={kind}, num_warps={v['num_warps']})
{finish}"""
