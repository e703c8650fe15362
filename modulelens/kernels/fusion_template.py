"""The fusing module template: a captured block's library calls kept, everything between them fused.

A module's forward is traced to aten operators above autograd (``make_fx`` with ``pre_dispatch``:
``aten.linear``, ``aten.scaled_dot_product_attention``, ``aten.layer_norm``, ``aten.dropout`` stay
whole), in training mode so that dropout shows. The operators are then sorted by what they are,
from the traced graph alone (no class name is looked at):

- **library calls** (:data:`LIBRARY`: matrix products, convolutions, attention) are kept: the
  candidate calls them as eager does and declares them (``# modulelens-library-ops:``), so that
  validation credits it with the rest (:mod:`modulelens.kernels.library_ops`). A linear layer's
  bias is split off its product when the add can join a fused segment (bias + activation);
- **views** (view, transpose, split, contiguous, ...) run as in eager;
- everything else is **fused**: each segment of connected pointwise and normalisation operators
  between library calls (bias + activation, SiLU(gate) * up, LayerNorm and RMSNorm with their
  affine parameters, residual add + dropout + norm, GPT-2's tanh GELU) becomes one C++ loop over
  the rows of its tensors, forward, and one for its backward, derived here by reverse-mode
  differentiation of the same per-element program (the parameter gradients summed over rows per
  thread). Dropout masks are drawn where eager draws them (``empty_like(x).bernoulli_(1 - p)``,
  the same generator calls in the same order), applied inside the loop;
- attention that draws dropout in training (where eager runs attention's math path, its softmax
  in aten) becomes two kept matrix products around one fused scale + causal mask + softmax +
  dropout loop over the score rows (of any length); in eval, and without dropout, the library
  call stays whole.

Variants (:data:`VARIANTS`): float32 exp, erf and tanh by the prelude's vectorisable polynomials
(eager's own formulas for GELU), or by the C library. The program between the loops runs in
Python (one precompiled function per step), which costs a few microseconds per step: on small
blocks that overhead is what the fusion has to win back.

A segment's tensors are all of one shape ``[rows, n]`` (leading dimensions flattened), its
per-row values (a norm's mean) ``[rows, 1]``, its per-column ones (weights, biases) ``[n]``.
Anything outside these -- an operator the template has no formula for, a tensor of another shape
in a segment, a reduction over other dimensions, a module with other inputs than one tensor --
is a :class:`~modulelens.kernels.module_templates.NotFusable` naming the operator and why.

The shape rule: every dimension of the input but the last may vary (``# modulelens-variable-dims:``);
the template traces at sizes chosen not to collide with any other size in the graph, so that each
view's sizes are rewritten in terms of the input's (:func:`fusion_plan`).
"""

from __future__ import annotations

import hashlib
import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from modulelens.kernels.module_templates import NotFusable
from modulelens.kernels.shape_rules import ShapeRule, VariableDim, declaration

FAMILY = "fused_segments"
VARIANTS = ({"math": "vectorised"}, {"math": "libm"})
GRAIN = 16384  # elements below which a loop runs on one thread
_FLOATS = (torch.float32, torch.float64)

# Library calls kept, with the aten operators eager runs for them (declared in the header).
LIBRARY: dict[str, tuple[str, ...]] = {
    "aten.linear.default": ("linear", "matmul", "mm", "addmm"),
    "aten.matmul.default": ("matmul", "mm", "bmm"),
    "aten.mm.default": ("mm",),
    "aten.addmm.default": ("addmm",),
    "aten.bmm.default": ("bmm",),
    "aten.baddbmm.default": ("baddbmm",),
    "aten.scaled_dot_product_attention.default": (
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu", "_fused_sdp_choice"),
    "aten.conv1d.default": ("conv1d", "convolution", "_convolution", "mkldnn_convolution"),
    "aten.conv2d.default": ("conv2d", "convolution", "_convolution", "mkldnn_convolution"),
}
VIEWS = frozenset({
    "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.transpose.int",
    "aten.permute.default", "aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default",
    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.t.default", "aten.contiguous.default",
    "aten.flatten.using_ints", "aten.unflatten.int", "aten.select.int", "aten.slice.Tensor", "getitem",
    "aten.detach.default", "aten.alias.default", "aten.expand.default",
})
_IDENTITY = frozenset({"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
                       "aten.contiguous.default", "aten.clone.default", "aten.detach.default",
                       "aten.alias.default", "aten.to.dtype", "aten._to_copy.default"})
_UNARY = {"aten.neg.default": "neg", "aten.exp.default": "exp", "aten.tanh.default": "tanh",
          "aten.erf.default": "erf", "aten.sqrt.default": "sqrt", "aten.rsqrt.default": "rsqrt",
          "aten.sigmoid.default": "sigmoid", "aten.relu.default": "relu"}
_BINARY = {"aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.mul.Tensor": "mul", "aten.div.Tensor": "div",
           "aten.add.Scalar": "add", "aten.sub.Scalar": "sub", "aten.mul.Scalar": "mul", "aten.div.Scalar": "div"}
FUSED = frozenset({*_IDENTITY, *_UNARY, *_BINARY, "aten.rsub.Scalar", "aten.silu.default", "aten.gelu.default",
                   "aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.sum.dim_IntList", "aten.layer_norm.default",
                   "aten.rms_norm.default", "aten.dropout.default"})
_RNG = frozenset({"aten.dropout.default", "aten.scaled_dot_product_attention.default"})


def _target(node: torch.fx.Node) -> str:
    t = node.target
    if t is operator.getitem:
        return "getitem"
    return f"aten.{t._schema.name.split('::')[1]}.{t._overloadname}" if hasattr(t, "_schema") else str(t)


# --------------------------------------------------------------------------------------------
# The per-element program of one segment (IR) and its reverse-mode derivative.
# --------------------------------------------------------------------------------------------
@dataclass
class _Prog:
    """Nodes (op, args, constant, kind); kind E: per element, R: per row, C: per column, S: scalar."""

    nodes: list[tuple[str, tuple[int, ...], Any, str]] = field(default_factory=list)

    def kind(self, i: int) -> str:
        return self.nodes[i][3]

    def add(self, op: str, *args: int, c: Any = None, kind: str | None = None) -> int:
        if kind is None:
            kinds = {self.kind(a) for a in args}
            kind = "E" if "E" in kinds or {"R", "C"} <= kinds else ("R" if "R" in kinds else ("C" if "C" in kinds else "S"))
        self.nodes.append((op, tuple(args), c, kind))
        return len(self.nodes) - 1

    def const(self, v: float) -> int:
        return self.add("const", c=float(v), kind="S")

    # helpers
    def mul(self, a: int, b: int) -> int:
        return self.add("mul", a, b)

    def sum_of(self, terms: list[int]) -> int:
        out = terms[0]
        for t in terms[1:]:
            out = self.add("add", out, t)
        return out


def _partials(p: _Prog, i: int, g: int) -> list[tuple[int, int]]:
    """(operand, contribution to its adjoint) of node ``i`` given its adjoint ``g``."""
    op, args, c, _ = p.nodes[i]
    a = args[0] if args else None
    if op in ("add", "id"):
        return [(x, g) for x in args]
    if op == "sub":
        return [(args[0], g), (args[1], p.add("neg", g))]
    if op == "mul":
        return [(args[0], p.mul(g, args[1])), (args[1], p.mul(g, args[0]))]
    if op == "div":
        b = args[1]
        return [(a, p.add("div", g, b)), (b, p.add("neg", p.add("div", p.mul(g, i), b)))]
    if op == "neg":
        return [(a, p.add("neg", g))]
    if op == "exp":
        return [(a, p.mul(g, i))]
    if op == "tanh":
        return [(a, p.mul(g, p.add("sub", p.const(1), p.mul(i, i))))]
    if op == "erf":
        e = p.add("exp", p.add("neg", p.mul(a, a)))
        return [(a, p.mul(g, p.mul(p.const(2 / math.sqrt(math.pi)), e)))]
    if op == "sqrt":
        return [(a, p.add("div", p.mul(g, p.const(0.5)), i))]
    if op == "rsqrt":
        return [(a, p.mul(g, p.mul(p.const(-0.5), p.mul(i, p.mul(i, i)))))]
    if op == "sigmoid":
        return [(a, p.mul(g, p.mul(i, p.add("sub", p.const(1), i))))]
    if op == "relu":
        return [(a, p.mul(g, p.add("step", a)))]
    if op == "pow":
        return [(a, p.mul(g, p.mul(p.const(c), p.add("pow", a, c=c - 1))))]
    if op == "rowsum":
        return [(a, g)]
    if op == "rowmax":  # only ever a softmax's shift, which its result does not depend on
        return []
    if op == "causal":
        return [(a, p.add("causal", g, c=0.0))]
    if op == "drop":
        return [(a, p.add("drop", g, args[1], c=c))]
    if op in ("step", "const", "in", "col", "mask", "invn"):
        return []
    raise NotFusable(f"no derivative for the fused operator {op}")


def _backward(p: _Prog, outputs: list[int], e_inputs: list[int], c_inputs: list[int]) -> tuple[list[int], list[int]]:
    """Extend ``p`` with the adjoints: returns (per-element gradient node of each E input or -1,
    per-element contribution node of each C input's gradient or -1, to be summed over rows). The
    output gradients are E inputs numbered after the forward's."""
    n_in = sum(1 for op, *_ in p.nodes if op == "in")
    adj: dict[int, list[int]] = {}
    for k, o in enumerate(outputs):
        adj.setdefault(o, []).append(p.add("in", c=n_in + k, kind="E"))
    for i in range(len(p.nodes) - 1, -1, -1):
        if i not in adj or p.nodes[i][0] in ("in", "col", "mask", "const"):
            continue
        g = p.sum_of(adj[i])
        for operand, contrib in _partials(p, i, g):
            ko, kc = p.kind(operand), p.kind(contrib)
            if ko == "S":
                continue
            if ko == "R" and kc == "E":
                contrib = p.add("rowsum", contrib, kind="R")
            elif ko == "C" and kc != "C" and p.nodes[operand][0] != "col":
                raise NotFusable("a segment computes on a weight before using it (its gradient would need a "
                                 "column reduction of its own)")
            adj.setdefault(operand, []).append(contrib)
    e_grads = [p.sum_of(adj[i]) if i in adj else -1 for i in e_inputs]
    c_grads = [p.sum_of(adj[i]) if i in adj else -1 for i in c_inputs]
    return e_grads, c_grads


def _lit(x: float) -> str:
    if math.isnan(x):
        return "T(NAN)"
    if math.isinf(x):
        return "T(INFINITY)" if x > 0 else "T(-INFINITY)"
    return f"T({float(x)!r})"


def _expr(p: _Prog, i: int, v: Any) -> str:
    op, args, c, _ = p.nodes[i]
    a = [v(x) for x in args]
    if op == "in":
        return f"e{c}[base + j]"
    if op == "col":
        return f"c{c}[j]"
    if op == "mask":
        return f"(train ? m{c}[base + j] : T(1))"
    if op == "const":
        return _lit(c)
    if op in ("add", "sub", "mul", "div"):
        return f"({a[0]} {'+-*/'['add sub mul div'.split().index(op)]} {a[1]})"
    if op == "id":
        return a[0]
    if op == "neg":
        return f"(-{a[0]})"
    if op in ("exp", "tanh", "erf"):
        return f"ml_{op}({a[0]})"
    if op == "sqrt":
        return f"std::sqrt({a[0]})"
    if op == "rsqrt":
        return f"(T(1) / std::sqrt({a[0]}))"
    if op == "sigmoid":
        return f"(T(1) / (T(1) + ml_exp(-{a[0]})))"
    if op == "relu":
        return f"(({a[0]} > T(0) || {a[0]} != {a[0]}) ? {a[0]} : T(0))"
    if op == "step":
        return f"({a[0]} > T(0) ? T(1) : T(0))"
    if op == "pow":
        e = float(c)
        return {0.0: "T(1)", 1.0: a[0], 2.0: f"({a[0]} * {a[0]})", 3.0: f"({a[0]} * {a[0]} * {a[0]})"}.get(
            e, f"std::pow({a[0]}, {_lit(e)})")
    if op == "drop":
        return f"(train ? {a[0]} * {a[1]} * {_lit(c)} : {a[0]})"
    if op == "causal":  # a query row (r % N) sees keys up to its own position
        return f"(j > r % N ? {_lit(c)} : {a[0]})"
    if op == "invn":
        return "(T(1) / T(N))"
    raise NotFusable(f"no C++ form for {op}")


def _deps(p: _Prog, roots: list[int], stop: set[int]) -> list[int]:
    """Nodes ``roots`` need, stopping at (and excluding) ``stop``, in program order."""
    seen: set[int] = set()
    todo = [r for r in roots if r >= 0]
    while todo:
        i = todo.pop()
        if i in seen or i in stop:
            continue
        seen.add(i)
        todo.extend(p.nodes[i][1])
    return sorted(seen)


def _row_body(p: _Prog, e_out: list[int], c_out: list[int]) -> list[str]:
    """C++ statements for one row ``r`` (``base = r * N``): reductions in program order, then one
    loop writing the E outputs ``O[k]`` and adding the C contributions into ``acc``."""
    need = set(_deps(p, e_out + c_out, set()))
    lines: list[str] = []
    ready: set[int] = set()  # R/S values declared as row scalars
    name = lambda i: (_lit(p.nodes[i][2]) if p.nodes[i][0] == "const" else f"v{i}")  # noqa: E731

    def loop_stmts(roots: list[int]) -> list[str]:
        out = []
        for i in _deps(p, roots, ready):
            if p.nodes[i][0] != "const":
                out.append(f"const T v{i} = {_expr(p, i, name)};")
        return out

    for i in sorted(need):
        op, args, c, kind = p.nodes[i]
        if op == "rowsum":
            lines.append(f"T v{i} = T(0);")
            lines.append(f"#pragma omp simd reduction(+:v{i})")
            lines.append("for (int64_t j = 0; j < N; ++j) {")
            lines += ["  " + s for s in loop_stmts([args[0]])]
            lines.append(f"  v{i} += v{args[0]};" if p.nodes[args[0]][0] != "const" else f"  v{i} += {name(args[0])};")
            lines.append("}")
            ready.add(i)
        elif op == "rowmax":
            lines.append(f"T v{i} = T(-INFINITY);")
            lines.append("for (int64_t j = 0; j < N; ++j) {")
            lines += ["  " + s for s in loop_stmts([args[0]])]
            lines.append(f"  v{i} = (v{args[0]} > v{i} || v{args[0]} != v{args[0]}) ? v{args[0]} : v{i};")
            lines.append("}")
            ready.add(i)
        elif kind in ("R", "S") and op != "const":
            lines.append(f"const T v{i} = {_expr(p, i, name)};")
            ready.add(i)
        elif op == "const":
            ready.add(i)
    lines.append("#pragma omp simd")
    lines.append("for (int64_t j = 0; j < N; ++j) {")
    lines += ["  " + s for s in loop_stmts(e_out + c_out)]
    lines += [f"  o{k}[base + j] = {name(o)};" for k, o in enumerate(e_out)]
    lines += [f"  acc[{k} * N + j] += {name(o)};" for k, o in enumerate(c_out)]
    lines.append("}")
    return lines


def _kernel(fn: str, p: _Prog, e_out: list[int], c_out: list[int], n: int | None) -> str:
    body = "\n".join("      " + s for s in _row_body(p, e_out, c_out))
    counts = {op: 1 + max([c for o, _, c, _ in p.nodes if o == op], default=-1) for op in ("in", "col", "mask")}
    ptrs = "".join([f"  const T* __restrict__ e{k} = E[{k}];\n" for k in range(counts["in"])]
                   + [f"  const T* __restrict__ c{k} = C[{k}];\n" for k in range(counts["col"])]
                   + [f"  const T* __restrict__ m{k} = M[{k}];\n" for k in range(counts["mask"])]
                   + [f"  T* __restrict__ o{k} = O[{k}];\n" for k in range(len(e_out))])
    return f"""
template <typename T>
static void {fn}(const T* const* E, const T* const* C, const T* const* M, T* const* O, T* accs,
                 int64_t rows, int64_t ncols, bool train, int nt) {{
  {"constexpr int64_t N = " + str(n) if n else "const int64_t N = ncols"};
  (void)ncols;
{ptrs}  (void)E; (void)C; (void)M; (void)O; (void)train;
  #pragma omp parallel num_threads(nt) if(nt > 1)
  {{
    const int tid = ml_tid(), cnt = ml_cnt();
    const int64_t r0 = rows * tid / cnt, r1 = rows * (tid + 1) / cnt;
    T* __restrict__ acc = accs + (int64_t)tid * {max(len(c_out), 1)} * N;
    (void)acc;
    for (int64_t r = r0; r < r1; ++r) {{
      const int64_t base = r * N;
      (void)base;
{body}
    }}
  }}
}}
"""


def _entry(fn: str, n: int | None, n_e: int, n_c: int, n_m: int, n_o: int, c_out: int) -> str:
    """The C++ entry point of one loop: checks, allocation, dispatch on the dtype; returns the
    E outputs, then the summed C outputs."""
    return f"""
std::vector<at::Tensor> {fn}(std::vector<at::Tensor> e, std::vector<at::Tensor> c, std::vector<at::Tensor> m,
                             bool train) {{
  TORCH_CHECK(!e.empty() && e[0].dim() > 0, "{fn}: takes rows");
  const int64_t N = {n if n else "e[0].size(-1)"};
  TORCH_CHECK(e.size() == {n_e} && c.size() == {n_c} && m.size() == {n_m}, "{fn}: wrong number of tensors");
  const at::ScalarType dt = e[0].scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kDouble, "{fn} takes float32 or float64");
  const int64_t rows = e[0].numel() / N;
  for (auto& t : e) TORCH_CHECK(t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == dt && t.numel() == rows * N,
                                "{fn}: contiguous CPU tensors of rows x N elements");
  for (auto& t : c) TORCH_CHECK(t.is_contiguous() && t.scalar_type() == dt && t.numel() == N, "{fn}: columns of N");
  for (auto& t : m) TORCH_CHECK(!train || (t.is_contiguous() && t.scalar_type() == dt && t.numel() == rows * N),
                                "{fn}: masks like the rows");
  const int nt = rows * N >= {GRAIN}LL ? at::get_num_threads() : 1;
  std::vector<at::Tensor> out;
  for (int k = 0; k < {n_o}; ++k) out.push_back(ml_empty_contiguous({{rows, N}}, dt));
  at::Tensor accs = {c_out} ? at::zeros({{(int64_t)nt * {max(c_out, 1)} * N}}, at::TensorOptions().dtype(dt))
                         : ml_empty_contiguous({{1}}, dt);
  AT_DISPATCH_FLOATING_TYPES(dt, "{fn}", [&] {{
    std::vector<const scalar_t*> ep, cp, mp;
    std::vector<scalar_t*> op;
    for (auto& t : e) ep.push_back(t.data_ptr<scalar_t>());
    for (auto& t : c) cp.push_back(t.data_ptr<scalar_t>());
    for (auto& t : m) mp.push_back(train ? t.data_ptr<scalar_t>() : nullptr);
    for (auto& t : out) op.push_back(t.data_ptr<scalar_t>());
    {fn}_loop<scalar_t>(ep.data(), cp.data(), mp.data(), op.data(), accs.data_ptr<scalar_t>(), rows, N, train, nt);
    scalar_t* a = accs.data_ptr<scalar_t>();
    for (int k = 0; k < {c_out}; ++k) {{
      at::Tensor s = ml_empty_contiguous({{N}}, dt);
      scalar_t* sp = s.data_ptr<scalar_t>();
      for (int64_t j = 0; j < N; ++j) {{
        scalar_t v = 0;
        for (int t = 0; t < nt; ++t) v += a[((int64_t)t * {max(c_out, 1)} + k) * N + j];
        sp[j] = v;
      }}
      out.push_back(s);
    }}
  }});
  return out;
}}
"""


# --------------------------------------------------------------------------------------------
# The traced graph, its segments and the plan.
# --------------------------------------------------------------------------------------------
@dataclass
class Segment:
    """One fused loop: its members (graph node names in order), inputs and outputs."""

    index: int
    members: list[str]
    e_inputs: list[str] = field(default_factory=list)
    c_inputs: list[str] = field(default_factory=list)
    masks: list[tuple[str, float]] = field(default_factory=list)  # (dropout node, p)
    outputs: list[str] = field(default_factory=list)
    n: int = 0
    ops: list[str] = field(default_factory=list)
    cpp: str = ""

    def describe(self) -> str:
        return " + ".join(dict.fromkeys(o.removeprefix("aten.").split(".")[0] for o in self.ops))


@dataclass
class FusionPlan:
    """What the template does with a module: its steps, segments and library calls."""

    steps: list[tuple]  # the interpreter's program (see _RUNTIME)
    segments: list[Segment]
    library: list[str]  # graph targets kept as library calls
    state: list[tuple[str, list[int], str, bool]]  # (name, shape, dtype, is parameter)
    input_dims: int
    cpp: str = ""

    @property
    def library_ops(self) -> list[str]:
        return list(dict.fromkeys(f"aten.{b}" for t in self.library for b in LIBRARY[t]))

    def summary(self) -> str:
        segs = "; ".join(f"loop {s.index}: {s.describe()}" for s in self.segments)
        return (f"{len(self.segments)} fused loop(s) ({segs}); library calls kept: "
                f"{', '.join(dict.fromkeys(t.removeprefix('aten.').split('.')[0] for t in self.library)) or 'none'}")


def _trace(module: torch.nn.Module, x: torch.Tensor, names: list[str], tensors: list[torch.Tensor]) -> torch.fx.GraphModule:
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(*flat: torch.Tensor) -> Any:
        return functional_call(module, dict(zip(names, flat[:-1])), (flat[-1],))

    with torch.random.fork_rng():
        return make_fx(f, pre_dispatch=True)(*tensors, x)


def _ints(obj: Any, out: set[int]) -> None:
    if isinstance(obj, bool):
        return
    if isinstance(obj, int):
        out.add(abs(obj))
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _ints(o, out)


def _trace_sizes(k: int, taken: set[int]) -> list[int]:
    """``k`` leading sizes whose products collide with no size in ``taken``."""
    primes = [p for p in range(5, 200) if all(p % q for q in range(2, int(p ** 0.5) + 1))]
    for start in range(len(primes) - k):
        sizes = primes[start:start + k]
        prods = {math.prod(sizes[i] for i in range(k) if mask >> i & 1) for mask in range(1, 1 << k)}
        if not prods & taken:
            return sizes
    raise NotFusable("no tracing sizes distinct from the module's own sizes")


def _dim_expr(v: int, sizes: list[int]) -> Any:
    """``v`` as ("d", [dims]) when it is a product of the traced leading sizes, else ``v``."""
    if isinstance(v, bool) or not isinstance(v, int):
        return v
    k = len(sizes)
    for mask in range(1, 1 << k):
        idx = [i for i in range(k) if mask >> i & 1]
        if math.prod(sizes[i] for i in idx) == v:
            return ("d", idx)
    return v


def _encode(a: Any, refs: dict, sizes: list[int], shapes: bool) -> Any:
    if isinstance(a, torch.fx.Node):
        return ("r", refs[a])
    if isinstance(a, dict):
        return {k: _encode(v, refs, sizes, shapes) for k, v in a.items()}
    if isinstance(a, (list, tuple)):
        return [_encode(x, refs, sizes, shapes) for x in a]
    if isinstance(a, torch.dtype):
        return ("dtype", str(a).removeprefix("torch."))
    if shapes:
        return _dim_expr(a, sizes)
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    raise NotFusable(f"an argument {a!r} the template cannot write down")


def fusion_plan(module: torch.nn.Module, args: list, kwargs: dict) -> FusionPlan:
    """The plan of ``module`` called with ``args``/``kwargs`` (a captured call), or
    :class:`NotFusable` saying which operator or segment does not fit and why."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if len(args) != 1 or len(tensors) != 1 or any(v is not None for v in kwargs.values()):
        raise NotFusable("it takes other inputs than one tensor (the fusing template takes modules of one input)")
    x = tensors[0].detach()
    if x.dtype not in _FLOATS or x.device.type != "cpu" or x.dim() < 2:
        raise NotFusable(f"its input is a {x.device.type} {x.dtype} tensor of {x.dim()} dimension(s) "
                         "(the template takes CPU float32/float64 tensors of 2 or more dimensions)")
    state = dict(module.state_dict(keep_vars=True))
    params = {n for n, _ in module.named_parameters()}
    names = list(state)
    values = [t.detach() for t in state.values()]
    was_training = module.training
    module.train()
    try:
        first = _trace(module, x, names, values)
        taken: set[int] = set()
        for node in first.graph.nodes:
            _ints(list(node.args), taken)
        for t in values:
            _ints(list(t.shape), taken)
        taken.add(x.shape[-1])
        sizes = _trace_sizes(x.dim() - 1, taken)
        probe = torch.randn(*sizes, x.shape[-1], dtype=x.dtype)
        gm = _trace(module, probe, names, values)
    except NotFusable:
        raise
    except Exception as e:  # noqa: BLE001 - any tracing failure: nothing we can fuse
        raise NotFusable(f"its forward cannot be traced to aten operators with its one tensor input ({type(e).__name__}: "
                         f"{str(e)[:200]}; a module that needs more inputs, such as rotary position embeddings, is "
                         "not covered)") from None
    finally:
        module.train(was_training)
    return _plan(gm, names, state, params, sizes, probe)


def _plan(gm: torch.fx.GraphModule, names: list[str], state: dict, params: set[str], sizes: list[int],
          probe: torch.Tensor) -> FusionPlan:
    graph = gm.graph
    nodes = [n for n in graph.nodes]
    order = {n: i for i, n in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    refs: dict[torch.fx.Node, str] = {}
    for i, n in enumerate(placeholders):
        refs[n] = f"s:{names[i]}" if i < len(names) else "x"
    for n in nodes:
        if n.op == "call_function":
            refs[n] = n.name
        elif n.op == "get_attr":
            raise NotFusable(f"its traced graph holds a constant {n.target} (the template takes parameters and buffers only)")

    def val(n: Any) -> Any:
        return n.meta.get("val") if isinstance(n, torch.fx.Node) else None

    # Which nodes are fused, kept, or views; and where a linear's bias is split off.
    bias_split: set[torch.fx.Node] = set()
    for n in nodes:
        if n.op != "call_function":
            continue
        t = _target(n)
        if t not in FUSED and t not in LIBRARY and t not in VIEWS:
            raise NotFusable(f"its forward runs {t}, which is neither a library call kept, a view, nor an "
                             "operator the template fuses")
        bias = n.args[2] if t == "aten.linear.default" and len(n.args) > 2 else (
            n.args[0] if t == "aten.addmm.default" else None)
        if isinstance(bias, torch.fx.Node) and val(bias) is not None and val(bias).dim() == 1 and \
                all(_target(u) in FUSED for u in n.users):
            bias_split.add(n)

    def fusable(n: torch.fx.Node) -> bool:
        return n.op == "call_function" and _target(n) in FUSED

    def shape_of(n: Any) -> tuple[int, int] | None:
        v = val(n)
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            return None
        return v.numel() // max(v.shape[-1], 1), v.shape[-1]

    # Segments, in graph order: a fused node joins the segment of a fused producer when the
    # segment can run at this node's place (no outside node before it uses the segment's values).
    seg_of: dict[torch.fx.Node, int] = {}
    segs: list[list[torch.fx.Node]] = []
    for n in nodes:
        if not fusable(n):
            continue
        t = _target(n)
        rc = shape_of(n)
        joined = None
        producers = [a for a in n.all_input_nodes if a in seg_of]
        why = "its input is not a fused tensor"
        for a in producers:
            s = seg_of[a]
            rows, cols = shape_of(segs[s][0]) or (0, 0)
            if rc is None or (rc != (rows, cols) and rc != (rows, 1)):
                why = (f"it makes a {list(getattr(val(n), 'shape', []))} tensor from [{rows}, {cols}] rows (a fused "
                       f"segment holds its rows, [{rows}, 1] per-row values from reductions over the last dimension "
                       f"and [{cols}] weights)")
                continue
            members = set(segs[s])
            if any(u not in members and u is not n and order[u] < order[n] for m in segs[s] for u in m.users):
                continue
            joined = s
            break
        if joined is None:
            if t in _IDENTITY and not any(a in bias_split for a in n.all_input_nodes):
                continue  # a view of an outside value: runs as a view
            if rc is None or (t in ("aten.mean.dim", "aten.sum.dim_IntList")):
                raise NotFusable(f"{t} ({n.name}) cannot be fused: {why}")
            segs.append([n])
            seg_of[n] = len(segs) - 1
        else:
            segs[joined].append(n)
            seg_of[n] = joined

    # A segment of only a linear's bias add (or a view of one): the product keeps its bias.
    def bias_add_of(n: torch.fx.Node) -> torch.fx.Node | None:
        return next((a for a in n.all_input_nodes if a in bias_split), None)

    kept_segs = []
    for members in segs:
        own = [m for m in members if _target(m) not in _IDENTITY]
        if not own:
            for m in members:
                seg_of.pop(m)
            continue
        kept_segs.append(members)
    for i, members in enumerate(kept_segs):
        for m in members:
            seg_of[m] = i
    # A product's bias goes into the loops of its users when every user is fused; else it keeps it.
    split_ok = {lin for lin in bias_split if all(u in seg_of for u in lin.users)}

    steps: list[tuple] = []
    segments: list[Segment] = []
    library: list[str] = []
    last = {}
    for i, members in enumerate(kept_segs):
        last[members[-1]] = i
    seg_objs: dict[int, Segment] = {}
    for i, members in enumerate(kept_segs):
        seg_objs[i] = _segment(i, members, refs, split_ok, val)
    for n in nodes:
        if n.op != "call_function":
            continue
        t = _target(n)
        if n in seg_of:
            s = seg_objs[seg_of[n]]
            if t == "aten.dropout.default" and n.name in [m for m, _ in s.masks]:
                steps.append(("mask", n.name, _encode(list(val(n).shape), refs, sizes, True), dict(s.masks)[n.name]))
            if n in last:
                steps.append(("seg", s.index, [("r", r) for r in s.e_inputs], [("r", r) for r in s.c_inputs],
                              [m for m, _ in s.masks], [(o, _encode(list(val(_node(gm, o)).shape), refs, sizes, True))
                                                        for o in s.outputs]))
                segments.append(s)
            continue
        if t == "aten.scaled_dot_product_attention.default":
            attn = _attention_segment(len(kept_segs) + sum(1 for x in segments if x.index >= len(kept_segs)), n, val)
            if attn is not None:
                segments.append(attn)
                library += ["aten.matmul.default", t]
                (q, k, v), (prob, causal, scale) = n.args[:3], _sdpa_options(n)
                steps.append(("attn", refs[n], [("r", refs[q]), ("r", refs[k]), ("r", refs[v])], prob, causal, scale,
                              attn.index))
                continue
        if t in LIBRARY:
            a = list(n.args)
            if n in split_ok:
                if t == "aten.linear.default":
                    a = a[:2]
                else:  # addmm(bias, x, w) -> mm(x, w)
                    t, a = "aten.mm.default", a[1:3]
            library.append(t)
            steps.append(("op", refs[n], t, _encode(a, refs, sizes, False), _encode(dict(n.kwargs), refs, sizes, False),
                          t in _RNG))
            continue
        shapes = t in VIEWS and t not in ("getitem", "aten.transpose.int", "aten.select.int", "aten.t.default")
        steps.append(("op", refs[n], t, _encode(list(n.args), refs, sizes, shapes),
                      _encode(dict(n.kwargs), refs, sizes, False), False))
    out_node = next(n for n in nodes if n.op == "output")
    steps.append(("out", _encode(out_node.args[0], refs, sizes, False)))
    st = [(k, list(v.shape), str(v.dtype).removeprefix("torch."), k in params) for k, v in state.items()]
    plan = FusionPlan(steps=steps, segments=segments, library=list(dict.fromkeys(library)), state=st,
                      input_dims=probe.dim())
    if not segments:
        raise NotFusable("its traced graph has no pointwise or normalisation segment to fuse")
    plan.cpp = "".join(s.cpp for s in segments) + _module_def(segments)
    return plan


def _sdpa_options(n: torch.fx.Node) -> tuple[float, bool, float | None]:
    """(dropout_p, is_causal, scale) of a traced scaled_dot_product_attention call."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    given = {**dict(zip(names, n.args)), **n.kwargs}
    if given.get("attn_mask") is not None or given.get("enable_gqa"):
        raise NotFusable(f"scaled_dot_product_attention ({n.name}) takes a mask or grouped heads: in training its "
                         "softmax would run in aten (the template fuses causal or unmasked attention)")
    return float(given.get("dropout_p", 0.0)), bool(given.get("is_causal", False)), given.get("scale")


def _attention_segment(index: int, n: torch.fx.Node, val: Any) -> Segment | None:
    """The fused scale + causal mask + softmax + dropout of an attention call that draws dropout
    in training (eager then runs attention's math path, its softmax in aten); None when it draws
    none (the library call stays whole). The loop's rows are the score rows, of any length."""
    prob, causal, scale = _sdpa_options(n)
    if prob <= 0:
        return None
    q, k = val(n.args[0]), val(n.args[1])
    if causal and q.shape[-2] != k.shape[-2]:
        raise NotFusable(f"scaled_dot_product_attention ({n.name}) is causal across {q.shape[-2]} queries and "
                         f"{k.shape[-2]} keys (the template fuses causal self-attention)")
    p = _Prog()
    x = p.add("in", c=0, kind="E")
    y = p.mul(x, p.const(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])))
    if causal:
        y = p.add("causal", y, c=float("-inf"))
    e = p.add("exp", p.add("sub", y, p.add("rowmax", y, kind="R")))
    out = p.add("drop", p.add("div", e, p.add("rowsum", e, kind="R")), p.add("mask", c=0, kind="E"), c=1 / (1 - prob))
    fwd = _Prog(nodes=list(p.nodes))
    (gx,), _ = _backward(p, [out], [x], [])
    seg = Segment(index=index, members=[n.name], e_inputs=[n.args[0].name], masks=[(n.name, prob)], outputs=[n.name],
                  n=0, ops=["mul", "causal mask" if causal else "scale", "softmax", "dropout"])
    k_ = f"seg{index}"
    seg.cpp = (_kernel(f"{k_}_fwd_loop", fwd, [out], [], None) + _entry(f"{k_}_fwd", None, 1, 0, 1, 1, 0)
               + _kernel(f"{k_}_bwd_loop", p, [gx], [], None) + _entry(f"{k_}_bwd", None, 2, 0, 1, 1, 0))
    return seg


def _node(gm: torch.fx.GraphModule, name: str) -> torch.fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


_OMP = """#include <ATen/Dispatch.h>
#include <ATen/ops/zeros.h>
#ifdef _OPENMP
#include <omp.h>
static inline int ml_tid() { return omp_get_thread_num(); }
static inline int ml_cnt() { return omp_get_num_threads(); }
#else
static inline int ml_tid() { return 0; }
static inline int ml_cnt() { return 1; }
#endif
"""


def _module_def(segments: list[Segment]) -> str:
    defs = " ".join(f'm.def("seg{s.index}_fwd", &seg{s.index}_fwd); m.def("seg{s.index}_bwd", &seg{s.index}_bwd);'
                    for s in segments)
    return f"\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ {defs} }}\n"


def _segment(index: int, members: list[torch.fx.Node], refs: dict, split_ok: set, val: Any) -> Segment:
    """Lower one segment's members to the per-element program and its C++ loops."""
    member_set = set(members)
    rows, n = members[0].meta["val"].numel() // members[0].meta["val"].shape[-1], members[0].meta["val"].shape[-1]
    seg = Segment(index=index, members=[m.name for m in members], n=n)
    p = _Prog()
    ids: dict[Any, int] = {}
    e_ids: list[int] = []
    c_ids: list[int] = []

    def operand(a: Any, user: torch.fx.Node) -> int:
        if isinstance(a, torch.fx.Node):
            if a in ids:
                return ids[a]
            v = val(a)
            if not isinstance(v, torch.Tensor):
                raise NotFusable(f"{_target(user)} ({user.name}) takes a non-tensor value {a.name}")
            if v.numel() == rows * n and v.shape[-1] == n:
                seg.e_inputs.append(refs[a])
                ids[a] = p.add("in", c=len(e_ids), kind="E")
                e_ids.append(ids[a])
                if a in split_ok:  # the product without its bias: the bias is added here
                    bias = a.args[2] if _target(a) == "aten.linear.default" else a.args[0]
                    ids[a] = p.add("add", ids[a], operand(bias, user))
                    seg.ops.append("bias")
            elif v.dim() == 1 and v.shape[0] == n:
                seg.c_inputs.append(refs[a])
                ids[a] = p.add("col", c=len(c_ids), kind="C")
                c_ids.append(ids[a])
            else:
                raise NotFusable(f"{_target(user)} ({user.name}) takes a {list(v.shape)} tensor {a.name} in a segment "
                                 f"of [{rows}, {n}] rows (only rows, per-row values and [{n}] weights are fused)")
            return ids[a]
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return p.const(a)
        raise NotFusable(f"{_target(user)} ({user.name}) takes {a!r}, which the template cannot fuse")

    def reduce_last(x: int, dims: Any, keep: bool, m: torch.fx.Node, mean: bool) -> int:
        v = val(m.args[0])
        d = [dims] if isinstance(dims, int) else list(dims)
        if [dd % v.dim() for dd in d] != [v.dim() - 1] or not keep:
            raise NotFusable(f"{_target(m)} ({m.name}) reduces over {d} (keepdim={keep}): only the last "
                             "dimension, kept, is fused")
        s = p.add("rowsum", x, kind="R")
        return p.mul(s, p.const(1.0 / n)) if mean else s

    for m in members:
        t = _target(m)
        a = list(m.args)
        if t in _IDENTITY:
            if t in ("aten.to.dtype", "aten._to_copy.default"):
                dt = a[1] if len(a) > 1 else m.kwargs.get("dtype")
                if dt not in (None, val(a[0]).dtype) or any(k not in ("dtype",) for k in m.kwargs):
                    raise NotFusable(f"{t} ({m.name}) changes the dtype (the template fuses one dtype)")
            ids[m] = operand(a[0], m)
        elif t in _UNARY:
            ids[m] = p.add(_UNARY[t], operand(a[0], m))
        elif t in _BINARY:
            x, y = operand(a[0], m), operand(a[1], m)
            alpha = m.kwargs.get("alpha", a[2] if len(a) > 2 else 1)
            if alpha != 1:
                y = p.mul(y, p.const(alpha))
            ids[m] = p.add(_BINARY[t], x, y)
        elif t == "aten.rsub.Scalar":
            ids[m] = p.add("sub", operand(a[1], m), operand(a[0], m))
        elif t == "aten.silu.default":
            x = operand(a[0], m)
            ids[m] = p.mul(x, p.add("sigmoid", x))
        elif t == "aten.gelu.default":
            x = operand(a[0], m)
            approx = m.kwargs.get("approximate", a[1] if len(a) > 1 else "none")
            if approx == "tanh":
                inner = p.mul(p.const(math.sqrt(2 / math.pi)),
                              p.add("add", x, p.mul(p.const(0.044715), p.add("pow", x, c=3.0))))
                ids[m] = p.mul(p.mul(p.const(0.5), x), p.add("add", p.const(1), p.add("tanh", inner)))
            else:
                ids[m] = p.mul(p.mul(p.const(0.5), x),
                               p.add("add", p.const(1), p.add("erf", p.mul(x, p.const(1 / math.sqrt(2))))))
        elif t == "aten.pow.Tensor_Scalar":
            ids[m] = p.add("pow", operand(a[0], m), c=float(a[1]))
        elif t in ("aten.mean.dim", "aten.sum.dim_IntList"):
            keep = m.kwargs.get("keepdim", a[2] if len(a) > 2 else False)
            if m.kwargs.get("dtype") is not None:
                raise NotFusable(f"{t} ({m.name}) changes the dtype")
            ids[m] = reduce_last(operand(a[0], m), a[1], keep, m, t == "aten.mean.dim")
        elif t in ("aten.layer_norm.default", "aten.rms_norm.default"):
            x = operand(a[0], m)
            shape = list(a[1])
            if shape != [n]:
                raise NotFusable(f"{t} ({m.name}) normalises over {shape} (the template fuses norms over the last dimension)")
            if t == "aten.layer_norm.default":
                w, b = (a[2] if len(a) > 2 else None), (a[3] if len(a) > 3 else None)
                eps = a[4] if len(a) > 4 else m.kwargs.get("eps", 1e-5)
                mean = p.mul(p.add("rowsum", x, kind="R"), p.const(1.0 / n))
                d = p.add("sub", x, mean)
                var = p.mul(p.add("rowsum", p.mul(d, d), kind="R"), p.const(1.0 / n))
                y = p.mul(d, p.add("rsqrt", p.add("add", var, p.const(eps))))
            else:
                w, b = (a[2] if len(a) > 2 else None), None
                eps = a[3] if len(a) > 3 and a[3] is not None else torch.finfo(val(a[0]).dtype).eps
                ms = p.mul(p.add("rowsum", p.mul(x, x), kind="R"), p.const(1.0 / n))
                y = p.mul(x, p.add("rsqrt", p.add("add", ms, p.const(eps))))
            if w is not None:
                y = p.mul(y, operand(w, m))
            if b is not None:
                y = p.add("add", y, operand(b, m))
            ids[m] = y
        elif t == "aten.dropout.default":
            prob, train = float(a[1]), bool(a[2])
            x = operand(a[0], m)
            if train and prob > 0:
                if prob >= 1:
                    raise NotFusable(f"dropout ({m.name}) with p={prob}")
                seg.masks.append((m.name, prob))
                mk = p.add("mask", c=len(seg.masks) - 1, kind="E")
                ids[m] = p.add("drop", x, mk, c=1.0 / (1.0 - prob))
            else:
                ids[m] = x
        else:
            raise NotFusable(f"{t} ({m.name}) has no fused form")
        seg.ops.append(t)
    outs = [m for m in members if any(u not in member_set for u in m.users)]
    for o in outs:
        if p.kind(ids[o]) != "E":
            raise NotFusable(f"{o.name} (a per-row value of {_target(o)}) is used outside its segment")
    seg.outputs = [o.name for o in outs]
    out_ids = [ids[o] for o in outs]
    fwd_prog = _Prog(nodes=list(p.nodes))
    e_grads, c_grads = _backward(p, out_ids, e_ids, c_ids)
    k = f"seg{index}"
    cpp = (_kernel(f"{k}_fwd_loop", fwd_prog, out_ids, [], n)
           + _entry(f"{k}_fwd", n, len(e_ids), len(c_ids), len(seg.masks), len(out_ids), 0)
           + _kernel(f"{k}_bwd_loop", p, [g if g >= 0 else p.const(0) for g in e_grads],
                     [g if g >= 0 else p.const(0) for g in c_grads], n)
           + _entry(f"{k}_bwd", n, len(e_ids) + len(out_ids), len(c_ids), len(seg.masks), len(e_ids), len(c_ids)))
    seg.cpp = cpp
    return seg


# --------------------------------------------------------------------------------------------
# The ModelNew source.
# --------------------------------------------------------------------------------------------
_RUNTIME = '''
def _dims(x, spec):
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "d":
        n = 1
        for i in spec[1]:
            n *= x.shape[i]
        return n
    return spec


def _value(env, x, a):
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "r":
        return env[a[1]]
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "dtype":
        return getattr(torch, a[1])
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "d":
        return _dims(x, a)
    if isinstance(a, list):
        return [_value(env, x, v) for v in a]
    return a


def _fused(index, n_e, n_c):
    fwd, bwd = getattr(_ext, f"seg{index}_fwd"), getattr(_ext, f"seg{index}_bwd")

    class _Seg(torch.autograd.Function):
        @staticmethod
        def forward(ctx, train, masks, *tensors):
            e = [t.contiguous() for t in tensors[:n_e]]
            c = [t.contiguous() for t in tensors[n_e:]]
            ctx.save_for_backward(*e, *c)
            ctx.train, ctx.masks = train, masks
            return tuple(fwd(e, c, masks, train))

        @staticmethod
        def backward(ctx, *grads):
            saved = ctx.saved_tensors
            e, c = list(saved[:n_e]), list(saved[n_e:])
            g = [torch.zeros_like(e[0]) if gr is None else gr.contiguous() for gr in grads]
            out = bwd(e + g, c, ctx.masks, ctx.train)
            return (None, None, *[o.view(t.shape) for o, t in zip(out, saved)])

    return _Seg


_SEGS = {i: _fused(i, n_e, n_c) for i, (n_e, n_c) in SEGMENTS.items()}


_FAST = {  # the Python entry points of the same operators (the dispatcher's op objects cost more per call)
    "aten.view.default": torch.Tensor.view, "aten.reshape.default": torch.Tensor.reshape,
    "aten._unsafe_view.default": torch.Tensor.reshape, "aten.transpose.int": torch.Tensor.transpose,
    "aten.permute.default": torch.Tensor.permute, "aten.split.Tensor": torch.Tensor.split,
    "aten.contiguous.default": torch.Tensor.contiguous, "aten.unsqueeze.default": torch.Tensor.unsqueeze,
    "aten.t.default": torch.Tensor.t, "aten.expand.default": torch.Tensor.expand,
    "aten.linear.default": torch.nn.functional.linear, "aten.mm.default": torch.mm, "aten.addmm.default": torch.addmm,
    "aten.bmm.default": torch.bmm, "aten.matmul.default": torch.matmul,
}


def _getter(spec):
    """A function (env, x) -> the value ``spec`` names (precompiled once per step)."""
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "r":
        name = spec[1]
        return lambda env, x: env[name]
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] in ("d", "dtype"):
        return lambda env, x: _value(env, x, spec)
    if isinstance(spec, list):
        parts = [_getter(v) for v in spec]
        if all(getattr(g, "const", False) for g in parts):
            return _const([g.value for g in parts])
        return lambda env, x: [g(env, x) for g in parts]
    if isinstance(spec, dict):
        parts = {k: _getter(v) for k, v in spec.items()}
        return lambda env, x: {k: g(env, x) for k, g in parts.items()}
    return _const(spec)


def _const(v):
    def get(env, x):
        return v
    get.const, get.value = True, v
    return get


def _compiled(step):
    """The function (env, x, train) running one step of the program."""
    kind = step[0]
    if kind == "op":
        _, name, target, args, kwargs, rng = step
        a, k = _getter(args), _getter(kwargs)
        if target == "getitem":
            def run(env, x, train):
                seq, i = a(env, x)
                env[name] = seq[i]
            return run
        _, op, overload = target.split(".")
        fn = _FAST.get(target) or getattr(getattr(torch.ops.aten, op), overload)

        def run(env, x, train):
            av, kv = a(env, x), k(env, x)
            if rng and not train:  # attention's dropout off in eval, as eager's modules do
                av = list(av)
                if len(av) > 4:
                    av[4] = 0.0
                if "dropout_p" in kv:
                    kv = {**kv, "dropout_p": 0.0}
            env[name] = fn(*av, **kv)
        return run
    if kind == "mask":  # drawn where eager's dropout draws it
        _, name, shape, prob = step
        size = _getter(shape)

        def run(env, x, train):
            if train:
                env["mask:" + name] = torch.empty(size(env, x), dtype=x.dtype).bernoulli_(1 - prob)
        return run
    if kind == "seg":
        _, index, e, c, masks, outs = step
        ins = [_getter(r) for r in e + c]
        shapes = [(name, _getter(shape)) for name, shape in outs]
        fused = _SEGS[index]

        fwd = getattr(_ext, f"seg{index}_fwd")
        n_e = len(e)

        def run(env, x, train):
            vals = [g(env, x) for g in ins]
            m = [env["mask:" + n] for n in masks] if train else [vals[0]] * len(masks)
            if torch.is_grad_enabled() and any(v.requires_grad for v in vals):
                got = fused.apply(train, m, *vals)
            else:  # nothing to differentiate: the loop without autograd's bookkeeping
                got = fwd([v.contiguous() for v in vals[:n_e]], [v.contiguous() for v in vals[n_e:]], m, train)
            for (name, shape), val in zip(shapes, got):
                env[name] = val.view(shape(env, x))
        return run
    if kind == "attn":
        _, name, qkv, prob, causal, scale, index = step
        get = [_getter(r) for r in qkv]
        fused = _SEGS[index]

        def run(env, x, train):
            q, k, v = (g(env, x) for g in get)
            if not train:  # no dropout: the library call whole
                env[name] = torch.nn.functional.scaled_dot_product_attention(q, k, v, None, 0.0, causal, scale=scale)
                return
            scores = torch.matmul(q, k.transpose(-2, -1))
            mask = torch.empty(scores.shape, dtype=scores.dtype).bernoulli_(1 - prob)  # where eager draws it
            (probs,) = fused.apply(True, [mask], scores)
            env[name] = torch.matmul(probs.view(scores.shape), v)
        return run
    out = _getter(step[1])

    def run(env, x, train):
        env["<out>"] = out(env, x)
    return run


PROGRAM = [_compiled(step) for step in STEPS]


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self._state_slots = []
        for name, shape, dtype, is_param in STATE:
            *path, leaf = name.split(".")
            owner = self
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            t = torch.zeros(shape, dtype=getattr(torch, dtype))
            if is_param:
                owner.register_parameter(leaf, nn.Parameter(t))
            else:
                owner.register_buffer(leaf, t)
            self._state_slots.append(("s:" + name, owner._parameters if is_param else owner._buffers, leaf))

    def forward(self, x):
        env = {"x": x}
        for key, slots, leaf in self._state_slots:
            env[key] = slots[leaf]
        train = self.training
        for run in PROGRAM:
            run(env, x, train)
        return env["<out>"]
'''


def render_fused(plan: FusionPlan, variant: int = 0) -> str:
    """The ``ModelNew`` source of ``plan``, variant ``variant`` of :data:`VARIANTS` (float32 exp, erf
    and tanh by the prelude's vectorisable polynomials, or by the C library)."""
    from modulelens.kernels.backends import get_backend
    from modulelens.kernels.templates.cpp import CPP_MATH, CPP_PRELUDE

    cpp = get_backend("cpp")
    loops = plan.cpp
    if VARIANTS[variant]["math"] == "libm":
        for f in ("exp", "erf", "tanh"):
            loops = loops.replace(f"ml_{f}(", f"std::{f}(")
    source_cpp = CPP_PRELUDE + CPP_MATH + _OMP + loops
    digest = hashlib.sha256((source_cpp + " ".join(cpp.cflags())).encode()).hexdigest()[:12]
    rule = ShapeRule(dims=[VariableDim(at=[(0, d)]) for d in range(plan.input_dims - 1)])
    by_seg = {s.index: (len(s.e_inputs), len(s.c_inputs)) for s in plan.segments}
    lines = "\n".join(f"#   loop {s.index}: {s.describe()} ({len(s.e_inputs)} row input(s), {len(s.c_inputs)} "
                      f"weight(s), {len(s.masks)} dropout mask(s))" for s in plan.segments)
    return f'''"""modulelens module template: family {FAMILY}, variant {variant} {VARIANTS[variant]}.

{plan.summary()}. Each fused loop runs forward and backward in C++ (its own autograd.Function);
the library calls and views run as in eager.
"""
# modulelens-library-ops: {", ".join(plan.library_ops)}
{declaration(rule, "#")}{lines}
import torch
from torch import nn
from torch.utils.cpp_extension import load_inline

CPP = {source_cpp!r}

_ext = load_inline(name="modulelens_fused_{digest}", cpp_sources=[CPP], extra_cflags={cpp.cflags()!r},
                   extra_ldflags={cpp.ldflags()!r}, no_implicit_headers=True, verbose=False)

STATE = {plan.state!r}
STEPS = {plan.steps!r}
SEGMENTS = {by_seg!r}
''' + _RUNTIME
