"""Module-level templates: fused ``ModelNew`` sources for blocks we know how to fuse.

The one family so far is the *pointwise chain*: a module without parameters or buffers whose
forward, traced to aten operators (``make_fx``), takes one floating tensor and computes its output
element by element (GPT-2's ``NewGELUActivation``: eight operators, eight passes over memory in
eager). The template fuses the chain into one C++ loop, and its backward too: the backward graph is
traced the same way (autograd's own formulas, ``tanh_backward``, ...), so ``ModelNew`` runs its own
backward (an ``autograd.Function``) in one pass. Every intermediate is computed in the tensor's
dtype with the operators eager would run, in eager's order.

:func:`pointwise_chain` says why a module does not fit (``NotFusable``); :func:`render_pointwise`
gives the source of one variant (:data:`VARIANTS`: the parallel grain). Everything is
specialised for nothing: the kernels take any contiguous float32 or float64 tensor, so the source
declares every dimension of a contiguous captured input variable (``# modulelens-variable-dims:``,
checked by validation at other sizes, :mod:`modulelens.kernels.shape_rules`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from modulelens.kernels.shape_rules import ShapeRule, VariableDim, declaration

FAMILY = "pointwise_chain"
VARIANTS = ({"grain": 32768}, {"grain": 8192}, {"grain": 1 << 40})
_FLOATS = (torch.float32, torch.float64)


class NotFusable(Exception):
    """The module is outside what a module template covers (the message says why)."""


def _lit(x: float) -> str:
    if math.isnan(x):
        return "T(NAN)"
    if math.isinf(x):
        return "T(INFINITY)" if x > 0 else "T(-INFINITY)"
    return f"T({float(x)!r})"


def _pow(a: str, e: float) -> str:
    return {1.0: a, 2.0: f"({a} * {a})", 3.0: f"({a} * {a} * {a})", 0.5: f"std::sqrt({a})"}.get(
        float(e), f"std::pow({a}, {_lit(e)})")


def _sigmoid(a: str) -> str:
    return f"(T(1) / (T(1) + std::exp(-{a})))"


# aten overload -> C++ expression of its argument expressions (a: first, b: second, ...)
_OPS: dict[str, Any] = {
    "aten.add.Tensor": lambda a, b, alpha=1: f"({a} + {b})" if alpha == 1 else f"({a} + {_lit(alpha)} * {b})",
    "aten.add.Scalar": lambda a, b, alpha=1: f"({a} + {b})" if alpha == 1 else f"({a} + {_lit(alpha)} * {b})",
    "aten.sub.Tensor": lambda a, b, alpha=1: f"({a} - {b})" if alpha == 1 else f"({a} - {_lit(alpha)} * {b})",
    "aten.sub.Scalar": lambda a, b, alpha=1: f"({a} - {b})" if alpha == 1 else f"({a} - {_lit(alpha)} * {b})",
    "aten.rsub.Scalar": lambda a, b, alpha=1: f"({b} - {a})" if alpha == 1 else f"({b} - {_lit(alpha)} * {a})",
    "aten.mul.Tensor": lambda a, b: f"({a} * {b})",
    "aten.mul.Scalar": lambda a, b: f"({a} * {b})",
    "aten.div.Tensor": lambda a, b: f"({a} / {b})",
    "aten.div.Scalar": lambda a, b: f"({a} / {b})",
    "aten.neg.default": lambda a: f"(-{a})",
    "aten.exp.default": lambda a: f"std::exp({a})",
    "aten.log.default": lambda a: f"std::log({a})",
    "aten.tanh.default": lambda a: f"std::tanh({a})",
    "aten.erf.default": lambda a: f"std::erf({a})",
    "aten.sqrt.default": lambda a: f"std::sqrt({a})",
    "aten.rsqrt.default": lambda a: f"(T(1) / std::sqrt({a}))",
    "aten.reciprocal.default": lambda a: f"(T(1) / {a})",
    "aten.abs.default": lambda a: f"std::abs({a})",
    "aten.relu.default": lambda a: f"({a} > T(0) ? {a} : T(0))",
    "aten.sigmoid.default": lambda a: _sigmoid(a),
    "aten.silu.default": lambda a: f"({a} * {_sigmoid(a)})",
    "aten.pow.Tensor_Scalar": lambda a, e: _pow(a, e),
    "aten.gelu.default": lambda a: f"(T(0.5) * {a} * (T(1) + std::erf({a} * T(0.7071067811865476))))",
    "aten.gelu_backward.default": lambda g, x: (f"({g} * (T(0.5) * (T(1) + std::erf({x} * T(0.7071067811865476))) + "
                                                f"{x} * std::exp(T(-0.5) * {x} * {x}) * T(0.3989422804014327)))"),
    "aten.tanh_backward.default": lambda g, y: f"({g} * (T(1) - {y} * {y}))",
    "aten.sigmoid_backward.default": lambda g, y: f"({g} * {y} * (T(1) - {y}))",
    "aten.silu_backward.default": lambda g, x: f"({g} * {_sigmoid(x)} * (T(1) + {x} * (T(1) - {_sigmoid(x)})))",
    "aten.threshold_backward.default": lambda g, x, t: f"({x} <= {_lit(t)} ? T(0) : {g})",
    "aten.detach.default": lambda a: a,
    "aten.alias.default": lambda a: a,
    "aten.clone.default": lambda a: a,
}


_RAW_SCALARS = ("aten.pow.Tensor_Scalar", "aten.threshold_backward.default")  # scalars the expression formats itself


def _op_name(target: Any) -> str:
    return f"aten.{target._schema.name.split('::')[1]}.{target._overloadname}" if hasattr(target, "_schema") else str(target)


def _chain(graph: torch.fx.Graph, shape: torch.Size, dtype: torch.dtype) -> tuple[list[str], list[str]]:
    """(C++ statements computing the graph's output per element, input names in order) of a
    traced graph; :class:`NotFusable` for anything but same-shape pointwise operators."""
    graph.eliminate_dead_code()
    names: dict[Any, str] = {}
    inputs: list[str] = []
    lines: list[str] = []
    for node in graph.nodes:
        if node.op == "placeholder":
            names[node] = f"in{len(inputs)}[i]"
            inputs.append(node.name)
        elif node.op == "call_function":
            op = _op_name(node.target)
            if op not in _OPS:
                raise NotFusable(f"its forward runs {op}, which the pointwise template does not cover")
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or val.shape != shape or val.dtype != dtype:
                raise NotFusable(f"{op} makes a {getattr(val, 'dtype', '?')} {list(getattr(val, 'shape', []))} "
                                 f"tensor (the template fuses operators on one shape and dtype)")
            raw = op in _RAW_SCALARS
            args = []
            for a in node.args:
                if isinstance(a, torch.fx.Node):
                    args.append(names[a])
                elif isinstance(a, (int, float)) and not isinstance(a, bool):
                    args.append(a if raw else _lit(a))
                else:
                    raise NotFusable(f"{op} takes an argument {a!r} the template cannot fuse")
            if set(node.kwargs) - {"alpha"}:
                raise NotFusable(f"{op} takes keyword arguments {sorted(node.kwargs)} the template cannot fuse")
            args += [node.kwargs["alpha"]] if "alpha" in node.kwargs else []
            names[node] = f"t{len(lines)}"
            lines.append(f"const T t{len(lines)} = {_OPS[op](*args)};")
        elif node.op == "output":
            (out,) = node.args[0] if isinstance(node.args[0], (list, tuple)) else (node.args[0],)
            lines.append(f"out[i] = {names[out]};")
        else:
            raise NotFusable(f"its traced forward has a {node.op} node")
    return lines, inputs


@dataclass
class PointwiseChain:
    """A module's forward and backward as per-element C++ statements."""

    forward: list[str]
    backward: list[str]
    ops: int
    variable_dims: int = 0  # the captured input's dimensions, each declared variable (0: a strided input, none)


def pointwise_chain(module: torch.nn.Module, args: list, kwargs: dict) -> PointwiseChain:
    """The fused form of ``module`` called with ``args``/``kwargs`` (a captured call), or
    :class:`NotFusable` saying why it does not fit."""
    from torch.fx.experimental.proxy_tensor import make_fx

    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise NotFusable("it has parameters or buffers (the pointwise template fuses parameter-free modules)")
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if len(args) != 1 or len(tensors) != 1 or any(v is not None for v in kwargs.values()):
        raise NotFusable("it takes other inputs than one tensor")
    x = tensors[0].detach()
    if x.dtype not in _FLOATS or x.device.type != "cpu":
        raise NotFusable(f"its input is a {x.device.type} {x.dtype} tensor (the template takes CPU float32/float64)")
    try:
        fwd = make_fx(lambda t: module(t))(x)
    except Exception as e:  # noqa: BLE001 - any tracing failure means: not a chain we can fuse
        raise NotFusable(f"its forward cannot be traced ({type(e).__name__})") from None
    forward, _ = _chain(fwd.graph, x.shape, x.dtype)

    def vjp(t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        t = t.detach().requires_grad_()
        with torch.enable_grad():
            out = module(t)
        return torch.autograd.grad(out, t, g)[0]

    try:
        bwd = make_fx(vjp)(x, torch.ones_like(x))
    except Exception as e:  # noqa: BLE001
        raise NotFusable(f"its backward cannot be traced ({type(e).__name__})") from None
    backward, _ = _chain(bwd.graph, x.shape, x.dtype)
    return PointwiseChain(forward=forward, backward=backward, ops=len(forward) - 1,
                          variable_dims=x.dim() if x.is_contiguous() else 0)


def _kernel(name: str, body: list[str], inputs: int, grain: int) -> str:
    params = ", ".join(f"const T* __restrict__ in{i}" for i in range(inputs))
    lines = "\n".join(f"    {x}" for x in body)
    return f"""template <typename T>
static void {name}_loop({params}, T* __restrict__ out, int64_t n) {{
  const int ml_threads = at::get_num_threads();
  #pragma omp parallel for simd schedule(static) num_threads(ml_threads) if(n >= {grain}LL)
  for (int64_t i = 0; i < n; ++i) {{
{lines}
  }}
}}
"""


def render_pointwise(chain: PointwiseChain, variant: int = 0) -> str:
    """The ``ModelNew`` source of ``chain``, variant ``variant`` of :data:`VARIANTS`."""
    from modulelens.kernels.backends import get_backend
    from modulelens.kernels.templates.cpp import CPP_PRELUDE

    grain = VARIANTS[variant]["grain"]
    cpp = get_backend("cpp")
    cpp_source = (CPP_PRELUDE + _kernel("fwd", chain.forward, 1, grain) + _kernel("bwd", chain.backward, 2, grain) + """
static at::ScalarType ml_floating(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), "takes contiguous CPU tensors");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, "takes float32 or float64");
  return t.scalar_type();
}

at::Tensor forward(const at::Tensor& x) {
  at::Tensor out = ml_empty_contiguous(x.sizes(), ml_floating(x));
  if (x.scalar_type() == at::kFloat) fwd_loop<float>(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  else fwd_loop<double>(x.data_ptr<double>(), out.data_ptr<double>(), x.numel());
  return out;
}

at::Tensor backward(const at::Tensor& x, const at::Tensor& g) {
  TORCH_CHECK(g.sizes() == x.sizes() && ml_floating(g) == ml_floating(x), "gradient like the input");
  at::Tensor out = ml_empty_contiguous(x.sizes(), x.scalar_type());
  if (x.scalar_type() == at::kFloat)
    bwd_loop<float>(x.data_ptr<float>(), g.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  else bwd_loop<double>(x.data_ptr<double>(), g.data_ptr<double>(), out.data_ptr<double>(), x.numel());
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); m.def("backward", &backward); }
""")
    digest = hashlib.sha256(cpp_source.encode()).hexdigest()[:12]
    rule = ShapeRule(dims=[VariableDim(at=[(0, d)]) for d in range(chain.variable_dims)])
    return f'''"""modulelens module template: family {FAMILY}, variant {variant} {VARIANTS[variant]}.

The module's {chain.ops} pointwise operators fused into one C++ loop, forward and backward (its
own autograd.Function); any contiguous float32/float64 input.
"""
{declaration(rule, "#") if rule.dims else ""}
import torch
from torch import nn
from torch.utils.cpp_extension import load_inline

CPP = {cpp_source!r}

_ext = load_inline(name="modulelens_pointwise_{digest}", cpp_sources=[CPP], extra_cflags={cpp.cflags()!r},
                   extra_ldflags={cpp.ldflags()!r}, no_implicit_headers=True, verbose=False)


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        ctx.save_for_backward(x)
        return _ext.forward(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _ext.backward(x, grad.contiguous())


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return _Fused.apply(x)
'''
