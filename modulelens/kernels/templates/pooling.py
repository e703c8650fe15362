"""Adaptive average pooling family: ``aten._adaptive_avg_pool2d.default(x, output_size)`` (and
``aten.adaptive_avg_pool2d.default``, which normally decomposes before dispatch: to
``_adaptive_avg_pool2d``, or to ``mean.dim([-1, -2])`` for an output of 1x1) on ``[N, C, H, W]``
or ``[C, H, W]``.

Bins as eager computes them: rows ``floor(i * H / OH)`` to ``ceil((i + 1) * H / OH)``, likewise
for columns, baked in as tables. CPU: planes in parallel, sums in double. Triton: a block of
outputs per program, each looping over its bin up to the widest bin. Channels-last inputs are made
contiguous and the output is returned in the eager output's layout. No CUDA template.

The planes (``N * C``) of a contiguous input may vary when the output is contiguous: batch and
channels are the shape rule the kernels declare (:mod:`modulelens.kernels.shape_rules`), the
number of planes and the output's leading sizes are read at run time; the spatial sizes (and so
the bins) stay as validated.
"""

from __future__ import annotations

from typing import Any

from modulelens.kernels.shape_rules import ShapeRule, VariableDim
from modulelens.kernels.templates.call import Call, NoMatch, TArg, contiguous_strides, dense, require_same_device
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
from modulelens.kernels.templates.triton import (
    TORCH_DTYPE,
    TRITON_PRELUDE,
    py_checks,
    py_header,
    py_return,
    py_signature,
)

FAMILY = "pooling"
OPS = ("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
BACKENDS = ("cpp", "triton")


def bins(size: int, out: int) -> tuple[list[int], list[int]]:
    starts = [(i * size) // out for i in range(out)]
    ends = [-((-(i + 1) * size) // out) for i in range(out)]
    return starts, ends


def match(call: Call) -> dict[str, Any]:
    require_same_device(call)
    x = call.arg("self")
    if not isinstance(x, TArg) or x.ndim not in (3, 4) or x.numel == 0:
        raise NoMatch("expected a non-empty [N, C, H, W] or [C, H, W] input")
    if not call.outputs:
        raise NoMatch("no output")
    out = call.outputs[0]
    h, w = x.shape[-2:]
    oh, ow = out.shape[-2:]
    if oh <= 0 or ow <= 0 or out.dtype != x.dtype:
        raise NoMatch("unexpected output")
    hs, he = bins(h, oh)
    ws, we = bins(w, ow)
    return {"op": call.op, "planes": x.numel // (h * w), "H": h, "W": w, "OH": oh, "OW": ow, "hs": hs, "he": he,
            "ws": ws, "we": we, "KH": max(e - s for s, e in zip(hs, he)), "KW": max(e - s for s, e in zip(ws, we)),
            "shape": list(x.shape), "out_shape": list(out.shape), "out_stride": list(out.stride),
            "out_contiguous": tuple(out.stride) == contiguous_strides(out.shape), "dtype": x.dtype,
            "input_contiguous": x.contiguous, "x": call.param("self")}


def shape_rule(call: Call, p: dict[str, Any], backend: str, v: dict[str, Any]) -> ShapeRule | None:
    """The dimensions before the spatial ones (batch, channels) vary, each on its own (contiguous
    input and output)."""
    if not (p["input_contiguous"] and p["out_contiguous"]):
        return None
    pos = call.schema_names.index("self")
    return ShapeRule(dims=[VariableDim(at=[(pos, d)]) for d in range(len(p["shape"]) - 2)])


def variants(backend: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    if backend == "cpp":
        return [{"grain": 32768}, {"grain": 8192}, {"grain": 1 << 40}]
    return [{"BLOCK": b, "num_warps": w} for b, w in ((128, 4), (256, 4), (64, 2), (512, 8))]


def render_cpp(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    T = CPP_SCALAR[p["dtype"]]
    dt = ATEN_DTYPE[p["dtype"]]
    src = dense(p["x"], p["input_contiguous"])
    ret = "out" if p["out_contiguous"] else f"ml_empty({ilist(p['out_shape'])}, {ilist(p['out_stride'])}, {dt}).copy_(out)"
    rule = p.get("rule")
    lead = len(p["shape"]) - 2
    alloc = (f"ml_empty_contiguous({cpp_leading_shape('xc', lead, [p['OH'], p['OW']])}, {dt})" if rule else
             f"ml_empty({ilist(p['out_shape'])}, {ilist(contiguous_strides(p['out_shape']))}, {dt})")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CPP_PRELUDE}
using T = {T};
constexpr int64_t {'' if rule else f"PLANES = {p['planes']}, "}H = {p['H']}, W = {p['W']}, OH = {p['OH']}, OW = {p['OW']};
static const int64_t HS[OH] = {ilist(p['hs'])}, HE[OH] = {ilist(p['he'])};
static const int64_t WS[OW] = {ilist(p['ws'])}, WE[OW] = {ilist(p['we'])};

{cpp_signature(call, "at::Tensor")} {{
{cpp_checks(call, rule)}
  const at::Tensor xc = {src};
{'  const int64_t PLANES = xc.numel() / (H * W);' if rule else ''}
  at::Tensor out = {alloc};
  const T* __restrict__ X = xc.data_ptr<T>();
  T* __restrict__ Y = out.data_ptr<T>();
  const int ml_threads = at::get_num_threads();
  #pragma omp parallel for schedule(static) num_threads(ml_threads) if(PLANES > 1 && PLANES * H * W >= {v['grain']}LL)
  for (int64_t pl = 0; pl < PLANES; ++pl) {{
    const T* __restrict__ xp = X + pl * H * W;
    T* __restrict__ yp = Y + pl * OH * OW;
    for (int64_t oh = 0; oh < OH; ++oh) {{
      for (int64_t ow = 0; ow < OW; ++ow) {{
        double s = 0.0;
        for (int64_t h = HS[oh]; h < HE[oh]; ++h) {{
          const T* __restrict__ row = xp + h * W;
          #pragma omp simd reduction(+:s)
          for (int64_t w = WS[ow]; w < WE[ow]; ++w) s += (double)row[w];
        }}
        yp[oh * OW + ow] = (T)(s / (double)((HE[oh] - HS[oh]) * (WE[ow] - WS[ow])));
      }}
    }}
  }}
  return {ret};
}}
"""


def render_triton(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    total = p["planes"] * p["OH"] * p["OW"]
    rule = p.get("rule")
    wide = rule is not None or p["planes"] * p["H"] * p["W"] >= 2**31
    lead = len(p["shape"]) - 2
    out_shape = f"tuple(x.shape[:{lead}]) + ({p['OH']}, {p['OW']})" if rule else str(p["out_shape"])
    total_expr = f"x.numel() // {p['H'] * p['W']} * {p['OH'] * p['OW']}" if rule else str(total)
    src = dense(p["x"], p["input_contiguous"])
    dt = TORCH_DTYPE[p["dtype"]]
    finish = py_return("out", p["out_contiguous"], p["out_shape"], p["out_stride"], p["dtype"])
    return f"""{py_header(call, FAMILY, variant, v, rule)}{TRITON_PRELUDE}

@triton.jit
def _adaptive_avg_pool2d(x_ptr, y_ptr, TOTAL{'' if rule else ': tl.constexpr'}, H: tl.constexpr, W: tl.constexpr, OH: tl.constexpr,
                         OW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0){'.to(tl.int64)' if wide else ''} * BLOCK + tl.arange(0, BLOCK)
    mask = idx < TOTAL
    ow = idx % OW
    oh = (idx // OW) % OH
    plane = idx // (OW * OH)
    h0 = (oh * H) // OH
    h1 = ((oh + 1) * H + OH - 1) // OH
    w0 = (ow * W) // OW
    w1 = ((ow + 1) * W + OW - 1) // OW
    acc = tl.zeros((BLOCK,), tl.float32)
    for kh in range(0, KH):
        for kw in range(0, KW):
            h = h0 + kh
            w = w0 + kw
            m = mask & (h < h1) & (w < w1)
            acc += tl.load(x_ptr + plane * (H * W) + h * W + w, mask=m, other=0.0).to(tl.float32)
    y = acc / ((h1 - h0) * (w1 - w0)).to(tl.float32)
    tl.store(y_ptr + idx, y.to(y_ptr.dtype.element_ty), mask=mask)


{py_signature(call)}
{py_checks(call, rule=rule)}
    x = {src}
    out = torch.empty({out_shape}, dtype={dt}, device=x.device)
    total = {total_expr}
    grid = (triton.cdiv(total, {v['BLOCK']}),)
    _adaptive_avg_pool2d[grid](x, out, TOTAL=total, H={p['H']}, W={p['W']}, OH={p['OH']}, OW={p['OW']},
                               KH={p['KH']}, KW={p['KW']}, BLOCK={v['BLOCK']}, num_warps={v['num_warps']})
{finish}"""
