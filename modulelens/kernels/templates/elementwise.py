"""Elementwise family: unary activations and binary arithmetic with broadcasting and scalars.

Unary: ``relu``, ``gelu`` (exact erf and ``approximate='tanh'``), ``silu``, ``sigmoid``, ``tanh``.
Binary: ``add``/``sub`` (with ``alpha``), ``mul``, ``div`` in their ``.Tensor`` and ``.Scalar``
overloads; the second operand may be a tensor that broadcasts (``[8,4,32,32] + [32,32]``), a
0-dim tensor, or a Python number (``aten.mul.Tensor(x, 2)`` reaches dispatch that way).
In-place overloads (``div_``) are not covered: the candidate contract forbids modifying inputs.

GELU's erf on CPU: variant 0 uses Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), the formula
eager's vectorised CPU kernel itself uses, so it vectorises and matches eager closely; a variant
uses Juffa's erff (about 1 ulp, ~25% slower) and one the C library's ``std::erf`` (exact, scalar,
about 10x slower). exp/tanh/sigmoid use vectorisable polynomial forms (see ``cpp.CPP_MATH``).
float64 uses the C library throughout.

The output is allocated with the eager output's strides (from the card); the loops run over it in
memory order, with loops merged where every operand allows it, so a same-layout operand is read
linearly, a broadcast one with a stride of 0, and a strided one through baked strides.

The leading dimensions merged into the outermost loop (the batch, and with operands that broadcast
only along the trailing dimensions the sequence length too) may vary when the output and the
operands are contiguous: the shape rule the kernels declare (see
:mod:`modulelens.kernels.shape_rules`; each such dimension tied across the operands that have it,
the ones broadcast along it fixed). The element count and the output's size are read at run time;
the index expressions never bound the outermost loop, so nothing else changes.
"""

from __future__ import annotations

import math
from typing import Any

from modulelens.kernels.shape_rules import ShapeRule, VariableDim
from modulelens.kernels.templates.call import Call, NoMatch, TArg, contiguous_strides, require_same_device
from modulelens.kernels.templates.cpp import (
    ATEN_DTYPE,
    CPP_MATH,
    CPP_PRELUDE,
    CPP_SCALAR,
    cpp_checks,
    cpp_header,
    cpp_literal,
    cpp_signature,
    ilist,
)
from modulelens.kernels.templates.cuda import CUDA_PRELUDE, CUDA_SCALAR, cuda_empty
from modulelens.kernels.templates.loops import broadcast_strides, loop_nest, offset_terms, outer_loop_dims
from modulelens.kernels.templates.triton import TRITON_PRELUDE, py_checks, py_empty, py_header, py_literal, py_signature

FAMILY = "elementwise"
UNARY = {"aten.relu.default": "relu", "aten.gelu.default": "gelu", "aten.silu.default": "silu",
         "aten.sigmoid.default": "sigmoid", "aten.tanh.default": "tanh"}
BINARY = {"aten.add.Tensor": "add", "aten.add.Scalar": "add", "aten.sub.Tensor": "sub", "aten.sub.Scalar": "sub",
          "aten.mul.Tensor": "mul", "aten.mul.Scalar": "mul", "aten.div.Tensor": "div", "aten.div.Scalar": "div"}
OPS = tuple(UNARY) + tuple(BINARY)
BACKENDS = ("cpp", "triton", "cuda")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def match(call: Call) -> dict[str, Any]:
    require_same_device(call)
    if call.op in UNARY:
        fn = UNARY[call.op]
        x = call.args[0] if call.args else None
        if not isinstance(x, TArg):
            raise NoMatch("the input is not a tensor")
        operands, scalar, alpha = [x], None, 1
        approximate = call.arg("approximate", "none") if fn == "gelu" else None
        if fn == "gelu" and approximate not in ("none", "tanh"):
            raise NoMatch(f"gelu approximate={approximate!r}")
    elif call.op in BINARY:
        fn = BINARY[call.op]
        a, b = call.arg("self"), call.arg("other")
        alpha = call.arg("alpha", 1)
        if not isinstance(a, TArg):
            raise NoMatch("the first operand is not a tensor")
        if not _number(alpha):
            raise NoMatch(f"alpha={alpha!r}")
        approximate = None
        if isinstance(b, TArg):
            operands, scalar = [a, b], None
        elif _number(b):
            operands, scalar = [a], b
        else:
            raise NoMatch(f"second operand {b!r}")
    else:
        raise NoMatch(f"{call.op} is not an elementwise operator of the library")
    if len(call.outputs) != 1:
        raise NoMatch("expected one output")
    out = call.outputs[0]
    dtypes = {t.dtype for t in operands} | {out.dtype}
    if len(dtypes) != 1:
        raise NoMatch(f"mixed dtypes {sorted(dtypes)} (templates take operands and output of one dtype)")
    if out.numel == 0:
        raise NoMatch("empty output")
    strides = [broadcast_strides(t, out.shape) for t in operands]
    loops = loop_nest(out, strides)
    names = [call.names[0]] if call.op in UNARY else [call.param("self"), call.param("other")][:len(operands)]
    return {"op": call.op, "fn": fn, "approximate": approximate, "scalar": scalar, "alpha": alpha,
            "operands": names, "loops": [[s, list(st)] for s, st in loops], "numel": out.numel, "dtype": out.dtype,
            "outer_dims": outer_loop_dims(out, strides),
            "out_shape": list(out.shape), "out_stride": list(out.stride)}


def _holders(call: Call, p: dict[str, Any]) -> list[tuple[int, list[tuple[int, str, int]]]]:
    """Each output dimension of the outermost loop with the operands that have it (not broadcast
    along it), as (position, name, their own dimension)."""
    out = call.outputs[0]
    found = []
    for d in p["outer_dims"]:
        have = []
        for name in p["operands"]:
            pos = call.names.index(name)
            t = call.values[pos]
            own = d - (out.ndim - t.ndim)
            if own >= 0 and t.shape[own] == out.shape[d]:
                have.append((pos, name, own))
        if have:
            found.append((d, have))
    return found


def shape_rule(call: Call, p: dict[str, Any], backend: str, v: dict[str, Any]) -> ShapeRule | None:
    """The dimensions of the outermost loop vary, each shared by the operands that have it, when the
    output and the operands are contiguous (see the module docstring)."""
    out = call.outputs[0]
    if tuple(out.stride) != contiguous_strides(out.shape):
        return None
    for name in p["operands"]:
        t = call.values[call.names.index(name)]
        if tuple(t.stride) != contiguous_strides(t.shape):
            return None
    dims = [VariableDim(at=[(pos, own) for pos, _, own in have]) for _, have in _holders(call, p)]
    return ShapeRule(dims=dims) if dims else None


def _runtime_sizes(call: Call, p: dict[str, Any], lang: str) -> dict[int, str]:
    """Output dimension -> the expression of its size at run time, for the dimensions that vary."""
    size = "shape[{}]" if lang == "triton" else "size({})"
    return {d: f"{have[0][1]}.{size.format(have[0][2])}" for d, have in _holders(call, p)}


def _runtime_numel(call: Call, p: dict[str, Any], lang: str) -> str:
    """The element count: the card's, or read at run time when dimensions vary."""
    if not p.get("rule"):
        return str(p["numel"])
    sizes = _runtime_sizes(call, p, lang)
    fixed = p["numel"] // math.prod(p["out_shape"][d] for d in sizes)
    return "(" + " * ".join([*sizes.values(), str(fixed)]) + ")"


def _out_shape(call: Call, p: dict[str, Any], lang: str) -> str:
    sizes = _runtime_sizes(call, p, lang)
    dims = [sizes.get(d, str(s)) for d, s in enumerate(p["out_shape"])]
    return "(" + "".join(f"{x}, " for x in dims) + ")" if lang == "triton" else "{" + ", ".join(dims) + "}"


def variants(backend: str, p: dict[str, Any]) -> list[dict[str, Any]]:
    if backend == "cpp":
        out = [{"grain": 32768}, {"grain": 8192}, {"grain": 131072}]
        if p["fn"] == "gelu" and p["approximate"] == "none":
            out += [{"grain": 32768, "erf": "accurate"}, {"grain": 32768, "erf": "libm"}]
        return out
    if backend == "triton":
        return [{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 2048, "num_warps": 8}, {"BLOCK": 512, "num_warps": 4},
                {"BLOCK": 4096, "num_warps": 8}]
    return [{"threads": 256}, {"threads": 128}, {"threads": 512}, {"threads": 1024}]


def expression(p: dict[str, Any], lang: str, ctype: str = "float", erf: str = "fast") -> str:
    """The elementwise expression over ``a`` (first operand) and ``b`` (second operand or scalar)."""
    fn = p["fn"]

    def lit(x: float) -> str:
        if lang == "cpp":
            return cpp_literal(x, ctype)
        if lang == "cuda":
            return f"{float(x)!r}f" if math.isfinite(float(x)) else cpp_literal(x, "float")
        return py_literal(x)

    exp = {"cpp": "ml_exp", "cuda": "expf", "triton": "tl.exp"}[lang]
    tanh = {"cpp": "ml_tanh", "cuda": "tanhf", "triton": "_tanh"}[lang]
    erf_fn = {"cpp": {"libm": "ml_erf_libm", "accurate": "ml_erf_accurate"}.get(erf, "ml_erf"), "cuda": "erff",
              "triton": "tl.math.erf"}[lang]
    one, half = lit(1.0), lit(0.5)
    if fn == "relu":
        return "tl.where(a < 0, 0.0, a)" if lang == "triton" else f"(a < {lit(0.0)} ? {lit(0.0)} : a)"
    if fn == "gelu" and p["approximate"] == "tanh":
        return f"{half} * a * ({one} + {tanh}({lit(math.sqrt(2.0 / math.pi))} * (a + {lit(0.044715)} * a * a * a)))"
    if fn == "gelu":
        return f"a * {half} * ({one} + {erf_fn}(a * {lit(math.sqrt(0.5))}))"
    if fn == "silu":
        return f"a / ({one} + {exp}(-a))"
    if fn == "sigmoid":
        return f"{one} / ({one} + {exp}(-a))"
    if fn == "tanh":
        return f"{tanh}(a)"
    b = "b" if p["scalar"] is None else lit(p["scalar"])
    alpha = p["alpha"]
    if fn in ("add", "sub"):
        scaled = b if alpha == 1 else f"{lit(alpha)} * {b}"
        return f"a {'+' if fn == 'add' else '-'} {scaled}"
    return f"a {'*' if fn == 'mul' else '/'} {b}"


def _operand_access(p: dict[str, Any], k: int, index: str, outer_only: bool, div: str = "/") -> str:
    loops = [(s, st) for s, st in p["loops"]]
    terms = offset_terms(loops, k + 1, index, outer_only)
    expr = " + ".join(terms) or "0"
    return expr.replace(" / ", f" {div} ") if div != "/" else expr


# ---------------------------------------------------------------------------------------------

def render_cpp(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    T = CPP_SCALAR[p["dtype"]]
    loops = p["loops"]
    rule = p.get("rule")
    n = "n" if rule else f"{p['numel']}LL"
    var = ["a", "b"]
    ptrs = "\n".join(f"  const T* __restrict__ in{k} = {name}.data_ptr<T>();" for k, name in enumerate(p["operands"]))
    expr = expression(p, "cpp", "T", v.get("erf", "fast"))
    grain = int(v["grain"])
    if len(loops) == 1:
        loads = "\n".join(
            f"    const T {var[k]} = in{k}[{_inner(loops[0][1][k + 1], 'i')}];" for k in range(len(p["operands"])))
        body = f"""\
  #pragma omp parallel for simd schedule(static) num_threads(ml_threads) if(parallel: {n} >= {grain}LL)
  for (int64_t i = 0; i < {n}; ++i) {{
{loads}
    y[i] = {expr};
  }}"""
    else:
        inner_size, inner_st = loops[-1]
        outer = f"({n} / {inner_size}LL)" if rule else f"{p['numel'] // inner_size}LL"
        bases = "\n".join(
            f"    const T* __restrict__ p{k} = in{k} + ({_operand_access(p, k, 'o', True)});" for k in range(len(p["operands"])))
        loads = "\n".join(
            f"      const T {var[k]} = p{k}[{_inner(inner_st[k + 1], 'i')}];" for k in range(len(p["operands"])))
        body = f"""\
  #pragma omp parallel for schedule(static) num_threads(ml_threads) if({n} >= {grain}LL)
  for (int64_t o = 0; o < {outer}; ++o) {{
{bases}
    T* __restrict__ yo = y + o * {inner_size}LL;
    #pragma omp simd
    for (int64_t i = 0; i < {inner_size}LL; ++i) {{
{loads}
      yo[i] = {expr};
    }}
  }}"""
    alloc = (f"ml_empty_contiguous({_out_shape(call, p, 'cpp')}, {ATEN_DTYPE[p['dtype']]})" if rule else
             f"ml_empty({ilist(p['out_shape'])}, {ilist(p['out_stride'])}, {ATEN_DTYPE[p['dtype']]})")
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CPP_PRELUDE}
{CPP_MATH}
using T = {T};

// loops (size, [out stride, operand strides]) outer to inner: {loops}
{cpp_signature(call, "at::Tensor")} {{
{cpp_checks(call, rule)}
  const int64_t n = {_runtime_numel(call, p, 'cpp')};
  (void)n;
  at::Tensor out = {alloc};
{ptrs}
  T* __restrict__ y = out.data_ptr<T>();
  const int ml_threads = at::get_num_threads();
  (void)ml_threads;
{body}
  return out;
}}
"""


def _inner(stride: int, index: str) -> str:
    return "0" if stride == 0 else (index if stride == 1 else f"{index} * {stride}")


def render_triton(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    ops = p["operands"]
    var = ["a", "b"]
    rule = p.get("rule")
    n = p["numel"]
    wide = bool(rule) or n * max([1] + [abs(s) for _, st in p["loops"] for s in st]) >= 2**31
    ptr_args = "".join(f", in{k}_ptr" for k in range(len(ops)))
    loads = "\n".join(
        f"    {var[k]} = tl.load(in{k}_ptr + ({_operand_access(p, k, 'i', False, '//')}), mask=mask, "
        f"other={'1.0' if k else '0.0'}).to(tl.float32)" for k in range(len(ops)))
    out = call.outputs[0]
    return f"""{py_header(call, FAMILY, variant, v, rule)}{TRITON_PRELUDE}

@triton.jit
def _elementwise(y_ptr{ptr_args}, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0){'.to(tl.int64)' if wide else ''}
    i = pid * BLOCK + tl.arange(0, BLOCK)
    mask = i < N
{loads}
    y = {expression(p, "triton")}
    tl.store(y_ptr + i, y.to(y_ptr.dtype.element_ty), mask=mask)


{py_signature(call)}
{py_checks(call, rule=rule)}
    n = {_runtime_numel(call, p, 'triton')}
    out = {f"torch.empty({_out_shape(call, p, 'triton')}, dtype={ops[0]}.dtype, device={ops[0]}.device)" if rule
           else py_empty(out, ops[0])}
    grid = (triton.cdiv(n, {v["BLOCK"]}),)
    _elementwise[grid](out{''.join(', ' + o for o in ops)}, n, BLOCK={v["BLOCK"]}, num_warps={v["num_warps"]})
    return out
"""


def render_cuda(call: Call, p: dict[str, Any], v: dict[str, Any], variant: int) -> str:
    ops = p["operands"]
    var = ["a", "b"]
    rule = p.get("rule")
    threads = int(v["threads"])
    params = "".join(f", const scalar_t* __restrict__ in{k}" for k in range(len(ops)))
    loads = "\n".join(
        f"    const float {var[k]} = static_cast<float>(in{k}[{_operand_access(p, k, 'i', False)}]);" for k in range(len(ops)))
    args = "".join(f", {o}.data_ptr<scalar_t>()" for o in ops)
    return f"""{cpp_header(call, FAMILY, variant, v, rule)}{CUDA_PRELUDE}
using scalar_t = {CUDA_SCALAR[p["dtype"]]};

// loops (size, [out stride, operand strides]) outer to inner: {p["loops"]}
__global__ void ml_elementwise(scalar_t* __restrict__ y{params}, int64_t n) {{
  const int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {{
{loads}
    y[i] = static_cast<scalar_t>({expression(p, "cuda")});
  }}
}}

{cpp_signature(call, "at::Tensor", cuda=True)} {{
{cpp_checks(call, rule)}
  const c10::cuda::CUDAGuard guard({ops[0]}.device());
  const int64_t n = {_runtime_numel(call, p, 'cuda')};
  at::Tensor out = {f"at::empty_strided({_out_shape(call, p, 'cuda')}, ml_contiguous_strides({_out_shape(call, p, 'cuda')}), {ops[0]}.options())" if rule else cuda_empty(call.outputs[0], ops[0])};
  if (n == 0) return out;
  const int64_t blocks = std::min<int64_t>((n + {threads} - 1) / {threads}, 65536LL);
  ml_elementwise<<<(unsigned)blocks, {threads}, 0, c10::cuda::getCurrentCUDAStream()>>>(out.data_ptr<scalar_t>(){args}, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}}
"""
