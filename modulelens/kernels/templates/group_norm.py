"""Group norm family: ``aten.native_group_norm.default(x, weight?, bias?, N, C, HxW, group, eps)
-> (out, mean [N, group], rstd [N, group])``.

Each (sample, group) is one contiguous block of ``C / group * HxW`` elements of a contiguous input.
CPU: mean and centred sum of squares in double, then per channel ``x * scale + shift`` with
``scale = rstd * w[c]`` and ``shift = b[c] - mean * scale`` (eager's factorisation); (sample,
group) blocks in parallel. Triton: one program per (sample, group), looping over the block. A
group holding an infinity gives a NaN mean, as eager's (Welford), in both backends.
No CUDA template.
"""

from __future__ import annotations

from typing import Any

from modulelens.kernels.templates.call import (
    Call,
    NoMatch,
    TArg,
    contiguous_strides,
    dense_operands,
    require_same_device,
)
from modulelens.kernels.templates.cpp import (
    ATEN_DTYPE,
    CPP_PRELUDE,
    CPP_SCALAR,
    cpp_checks,
    cpp_header,
    cpp_literal,
    cpp_signature,
    ilist,
)
from modulelens.kernels.templates.triton import (
    TORCH_DTYPE,
    TRITON_PRELUDE,
    py_checks,
    py_header,
    py_literal,
    py_return,
    py_signature,
)

FAMILY = "group_norm"
OPS = ("aten.native_group_norm.default",)
BACKENDS = ("cpp", "triton")


def match(call: Call) -> dict[str, Any]:
    require_same_device(call)
    x, w, b = call.arg("input"), call.arg("weight"), call.arg("bias")
    n, c, hxw, g, eps = (call.arg(k) for k in ("N", "C", "HxW", "group", "eps"))
    if not isinstance(x, TArg) or not all(isinstance(v, int) for v in (n, c, hxw, g)):
        raise NoMatch("expected a tensor input and integer N, C, HxW, group")
    if x.numel == 0 or x.numel != n * c * hxw or g <= 0 or c % g:
        raise NoMatch(f"input {list(x.shape)} with N={n} C={c} HxW={hxw} group={g}")
    for name, t in (("weight", w), ("bias", b)):
        if t is not None and (not isinstance(t, TArg) or t.numel != c or t.dtype != x.dtype):
            raise NoMatch(f"{name} must be None or a {x.dtype} tensor of {c} elements")
    if len(call.outputs) != 3:
        raise NoMatch("expected (out, mean, rstd)")
    out, mean, _ = call.outputs
    return {"op": call.op, "N": n, "C": c, "HxW": hxw, "G": g, "D": c // g, "eps": float(eps), "shape": list(x.shape),
            "out_stride": list(out.stride), "out_contiguous": tuple(out.stride) == contiguous_strides(out.shape),
            "stat_shape": list(mean.shape), "dtype": x.dtype, "stat_dtype": mean.dtype, "has_weight": w is not None,
            "has_bias": b is not None, "contiguous": [t.contiguous for t in (x, w, b) if t is not None],
            "x": call.param("input"), "w": call.param("weight"), "b": call.param("bias")}


def variants(backend: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    if backend == "cpp":
        return [{"grain": 32768}, {"grain": 8192}, {"grain": 1 << 40}]
    return [{"BLOCK": b, "num_warps": w} for b, w in ((1024, 4), (2048, 8), (4096, 8), (512, 4))]


def _sources(p: dict[str, Any]) -> tuple[str, str | None, str | None]:
    xs, ws, bs = dense_operands([p["x"], p["w"] if p["has_weight"] else None, p["b"] if p["has_bias"] else None],
                                p["contiguous"])
    return xs, ws, bs


def render_cpp(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    if p["stat_dtype"] != p["dtype"]:
        raise NoMatch("the cpp template keeps mean and rstd in the input dtype")
    T = CPP_SCALAR[p["dtype"]]
    dt = ATEN_DTYPE[p["dtype"]]
    hw, hb = p["has_weight"], p["has_bias"]
    xs, ws, bs = _sources(p)
    scale = "rs * W[ch]" if hw else "rs"
    shift = ("B[ch] - mu * scale" if hb else "-mu * scale")
    ret = "std::make_tuple(out, mean, rstd)" if p["out_contiguous"] else (
        f"std::make_tuple(ml_empty({ilist(p['shape'])}, {ilist(p['out_stride'])}, {dt}).copy_(out), mean, rstd)")
    return f"""{cpp_header(call, FAMILY, variant, v)}{CPP_PRELUDE}
using T = {T};
constexpr int64_t NB = {p['N']}, CH = {p['C']}, HXW = {p['HxW']}, G = {p['G']}, D = {p['D']};
constexpr double EPS = {cpp_literal(p['eps'], 'double')};
constexpr int64_t BLOCK = D * HXW;

{cpp_signature(call, "std::tuple<at::Tensor, at::Tensor, at::Tensor>")} {{
{cpp_checks(call)}
  const at::Tensor xc = {xs};
{f'  const at::Tensor wc = {ws};' if hw else ''}
{f'  const at::Tensor bc = {bs};' if hb else ''}
  at::Tensor out = ml_empty({ilist(p['shape'])}, {ilist(contiguous_strides(p['shape']))}, {dt});
  at::Tensor mean = ml_empty({ilist(p['stat_shape'])}, {ilist(contiguous_strides(p['stat_shape']))}, {dt});
  at::Tensor rstd = ml_empty({ilist(p['stat_shape'])}, {ilist(contiguous_strides(p['stat_shape']))}, {dt});
  const T* __restrict__ X = xc.data_ptr<T>();
{'  const T* __restrict__ W = wc.data_ptr<T>();' if hw else ''}
{'  const T* __restrict__ B = bc.data_ptr<T>();' if hb else ''}
  T* __restrict__ Y = out.data_ptr<T>();
  T* __restrict__ M = mean.data_ptr<T>();
  T* __restrict__ R = rstd.data_ptr<T>();
  const int ml_threads = at::get_num_threads();
  #pragma omp parallel for schedule(static) num_threads(ml_threads) if(NB * G > 1 && NB * CH * HXW >= {v['grain']}LL)
  for (int64_t ng = 0; ng < NB * G; ++ng) {{
    const T* __restrict__ xb = X + ng * BLOCK;
    T* __restrict__ yb = Y + ng * BLOCK;
    double s = 0.0;
    #pragma omp simd reduction(+:s)
    for (int64_t j = 0; j < BLOCK; ++j) s += (double)xb[j];
    const double mu_d = std::isfinite(s) ? s / BLOCK : NAN;  // as eager's Welford: an infinity makes NaN
    double q = 0.0;
    #pragma omp simd reduction(+:q)
    for (int64_t j = 0; j < BLOCK; ++j) {{ const double d = (double)xb[j] - mu_d; q += d * d; }}
    const double rs_d = 1.0 / std::sqrt(q / BLOCK + EPS);
    M[ng] = (T)mu_d;
    R[ng] = (T)rs_d;
    const T mu = (T)mu_d, rs = (T)rs_d;
    const int64_t g = ng % G;
    for (int64_t d = 0; d < D; ++d) {{
      const int64_t ch = g * D + d;
      (void)ch;
      const T scale = {scale};
      const T shift = {shift};
      const T* __restrict__ xc_ = xb + d * HXW;
      T* __restrict__ yc = yb + d * HXW;
      #pragma omp simd
      for (int64_t j = 0; j < HXW; ++j) yc[j] = xc_[j] * scale + shift;
    }}
  }}
  return {ret};
}}
"""


def render_triton(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    xs, ws, bs = _sources(p)
    n, g, block_elems = p["N"], p["G"], p["D"] * p["HxW"]
    wide = n * p["C"] * p["HxW"] >= 2**31
    pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    dt, st = TORCH_DTYPE[p["dtype"]], TORCH_DTYPE[p["stat_dtype"]]
    finish = py_return("out, mean, rstd", p["out_contiguous"], p["shape"], p["out_stride"], p["dtype"])
    return f"""{py_header(call, FAMILY, variant, v)}{TRITON_PRELUDE}

@triton.jit
def _group_norm(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, eps, G: tl.constexpr, D: tl.constexpr,
                HXW: tl.constexpr, BLOCK: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    ng = {pid}
    size = D * HXW
    base = ng * size
    g = ng % G
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, size, BLOCK):
        mask = start + offs < size
        xv = tl.load(x_ptr + base + start + offs, mask=mask, other=0.0).to(tl.float32)
        acc += (xv - xv) + xv  # xv - xv: NaN for an infinity, so the mean is NaN as eager's
    mean = tl.sum(acc, axis=0) / size
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, size, BLOCK):
        mask = start + offs < size
        xv = tl.load(x_ptr + base + start + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, xv - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / size + eps)
    for start in range(0, size, BLOCK):
        idx = start + offs
        mask = idx < size
        ch = g * D + idx // HXW
        xv = tl.load(x_ptr + base + idx, mask=mask, other=0.0).to(tl.float32)
        y = (xv - mean) * rstd
        if HAS_W:
            y = y * tl.load(w_ptr + ch, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(b_ptr + ch, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + idx, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + ng, mean.to(mean_ptr.dtype.element_ty))
    tl.store(rstd_ptr + ng, rstd.to(rstd_ptr.dtype.element_ty))


{py_signature(call)}
{py_checks(call)}
    x = {xs}
    w = {ws or 'x'}
    b = {bs or 'x'}
    out = torch.empty({p['shape']}, dtype={dt}, device=x.device)
    mean = torch.empty({p['stat_shape']}, dtype={st}, device=x.device)
    rstd = torch.empty({p['stat_shape']}, dtype={st}, device=x.device)
    _group_norm[({n * g},)](x, w, b, out, mean, rstd, {py_literal(p['eps'])}, G={g}, D={p['D']}, HXW={p['HxW']},
                            BLOCK={min(v['BLOCK'], max(16, 1 << (block_elems - 1).bit_length()))},
                            HAS_W={p['has_weight']}, HAS_B={p['has_bias']}, num_warps={v['num_warps']})
{finish}"""
