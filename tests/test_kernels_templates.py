"""The template library and the kernel backends (cpp, triton, cuda).

Per family: the cpp template compiled once and checked against the aten operator on several
inputs (random, special values, broadcast and non-contiguous operands where the family takes
them); the triton template under the interpreter (no GPU) or on the GPU; the cuda templates
compile-checked with nvcc (no GPU) or run (GPU, ``@pytest.mark.gpu``). Builds go to the default
persistent build cache (``MODULELENS_BUILD_DIR``), so reruns skip the compiles; a cold cache costs
about two minutes (nine cpp builds of ~8 s, four nvcc builds of ~15 s on two cores).
"""

from __future__ import annotations

import shutil

import pytest
import torch

from modulelens.errors import ModuleLensError
from modulelens.kernels import templates as T
from modulelens.kernels.backends.base import CompileError, default_build_dir, get_backend
from modulelens.ops.recorder import resolve_op

HAS_CUDA = torch.cuda.is_available()
HAS_NVCC = shutil.which("nvcc") is not None
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def _flat(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _compare(got, want, exact=None, rtol=1.3e-6, atol=1e-5):
    """``got`` within ``atol + rtol * |want|`` of eager, widened by eager's own distance from the
    float64 result ``exact`` where eager is the less accurate one (float accumulation)."""
    got, want = _flat(got), _flat(want)
    exact = _flat(exact) if exact is not None else [None] * len(want)
    assert len(got) == len(want)
    for g, w, x in zip(got, want, exact):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        assert g.stride() == w.stride() or g.numel() <= 1, (g.stride(), w.stride())
        g, w = g.detach().cpu().double(), w.detach().cpu().double()
        assert torch.equal(torch.isnan(g), torch.isnan(w)), "NaN positions differ"
        slack = 2 * (w - x.detach().cpu().double()).abs().nan_to_num(0.0) if x is not None else 0.0
        err = (g - w).abs().nan_to_num(0.0)
        bad = err > atol + rtol * w.abs().nan_to_num(0.0) + slack
        assert not bool(bad.any()), f"{int(bad.sum())} of {w.numel()} values off, max abs err {float(err.max()):.3g}"


def _check(backend: str, op: str, sample: list, inputs: list[list], kwargs: dict | None = None, variant: int = 0,
           rtol=1.3e-6, atol=1e-5):
    """Render the template for a card made from ``sample``, load it once, and compare with the aten
    operator on the sample and on every argument list in ``inputs`` (same shapes and strides)."""
    kwargs = kwargs or {}
    card = T.synthetic_card(op, sample, kwargs)
    ks = T.render(card, backend, variant)
    assert ks.provider == "template" and ks.family == T.match(card).family
    assert ks.params["variant"] == variant and ks.provenance == {"template": ks.family, "variant": variant}
    fn = get_backend(backend).load(ks.source, ks.entry, default_build_dir())
    aten = resolve_op(op)
    for args in [sample, *inputs]:
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        got = fn(*args, *kwargs.values())
        exact = aten(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args], **kwargs)
        _compare(got, aten(*args, **kwargs), exact, rtol, atol)
        for a, b in zip(args, before):  # inputs untouched
            if isinstance(a, torch.Tensor):
                assert torch.equal(a.nan_to_num(), b.nan_to_num())
    return ks


def _like(t: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(fill)


def _special(shape, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    specials = torch.tensor([0.0, -0.0, 1e4, -1e4, 1e-30, -1e-30, 1.0, -1.0, 8.0, -8.0], dtype=torch.float64)
    mask = torch.rand(shape, generator=g) < 0.1
    return torch.where(mask, specials[torch.randint(0, len(specials), shape, generator=g)], x).to(dtype)


# ---------------------------------------------------------------------------------------------
# Cases: (op, sample args, kwargs); the same cards serve cpp (compiled) and triton (interpreted).

def _x4():
    return torch.randn(8, 4, 32, 32)


def _neg_inf_rows(x):
    x = x.clone()
    x[0, 0, 3] = float("-inf")  # a whole row of -inf
    x[0, 1, 5, :7] = float("-inf")
    x[1, 0, 0, 3] = float("nan")
    return x


def test_elementwise_gelu_cpp():
    x = torch.randn(8, 32, 256)
    _check("cpp", "aten.gelu.default", [x], [[_special(x.shape)], [torch.randn(8, 32, 256) * 10]])


def test_elementwise_broadcast_add_cpp():
    x, b = _x4(), torch.randn(32, 32)
    ks = _check("cpp", "aten.add.Tensor", [x, b], [[_special(x.shape), _special(b.shape, seed=2)]], {"alpha": 2})
    assert ks.params["loops"] == [[32, [1024, 1024, 0]], [1024, [1, 1, 1]]]


def test_elementwise_noncontiguous_scalar_cpp():
    base = torch.randn(8, 32, 4, 16)
    x = base.permute(0, 2, 1, 3)  # [8, 4, 32, 16] with strides [2048, 16, 64, 1], as in the example block
    assert not x.is_contiguous()
    ks = _check("cpp", "aten.mul.Scalar", [x, 0.5], [[_like(x, _special(x.shape)), 0.5]])
    assert ks.params["out_stride"] == [2048, 16, 64, 1]  # eager keeps the input's layout


def test_softmax_cpp():
    x = _x4()
    _check("cpp", "aten._safe_softmax.default", [_neg_inf_rows(x), -1], [[x * 30, -1], [_special(x.shape), -1]])


def test_layer_norm_cpp():
    x = torch.randn(8, 32, 64) * 3 + 5
    w, b = torch.randn(64), torch.randn(64)
    _check("cpp", "aten.native_layer_norm.default", [x, [64], w, b, 1e-5],
           [[_special(x.shape), [64], w, b, 1e-5], [torch.randn(8, 32, 64) * 1e3, [64], w, b, 1e-5]])


def test_rms_norm_cpp():
    x, w = torch.randn(8, 32, 64), torch.randn(64)
    _check("cpp", "aten._fused_rms_norm.default", [x, [64], w, 1e-6], [[_special(x.shape), [64], w, 1e-6]])


def test_group_norm_cpp():
    x = torch.randn(2, 8, 5, 3) + 3
    w, b = torch.randn(8), torch.randn(8)
    _check("cpp", "aten.native_group_norm.default", [x, w, b, 2, 8, 15, 4, 1e-5],
           [[_special(x.shape), w, b, 2, 8, 15, 4, 1e-5]])


def test_reduction_cpp():
    x = torch.randn(4, 37, 600)  # inner 600 > one strip of 512
    y = _special(x.shape)
    y[1, :, 7] = float("nan")
    _check("cpp", "aten.amax.default", [x, [1], True], [[y, [1], True]])


def test_pooling_cpp():
    x = torch.randn(2, 3, 10, 7)
    _check("cpp", "aten._adaptive_avg_pool2d.default", [x, [3, 5]], [[_special(x.shape), [3, 5]]])


def _rule_cases():
    """(op, sample args, make args of a shape) of the families whose kernels take other sizes."""
    w, b = torch.randn(64), torch.randn(64)
    half = torch.randn(16, 32)
    return {
        "elementwise": ("aten.mul.Tensor", [torch.randn(4, 16, 32), half], lambda s: [torch.randn(*s, 16, 32), half],
                        [(1,), (9,)]),
        "layer_norm": ("aten.native_layer_norm.default", [torch.randn(2, 16, 64), [64], w, b, 1e-5],
                       lambda s: [torch.randn(*s, 64), [64], w, b, 1e-5], [(1, 1), (3, 33), (5, 9)]),
        "reduction": ("aten.mean.dim", [torch.randn(4, 8, 6), [1], True], lambda s: [torch.randn(*s, 8, 6), [1], True],
                      [(1,), (9,)]),
        "pooling": ("aten._adaptive_avg_pool2d.default", [torch.randn(2, 3, 10, 7), [3, 5]],  # test_pooling_cpp's build
                    lambda s: [torch.randn(*s, 10, 7), [3, 5]], [(1, 1), (5, 9)]),
        "rms_norm": ("aten._fused_rms_norm.default", [torch.randn(2, 16, 64), [64], w, 1e-5],
                     lambda s: [torch.randn(*s, 64), [64], w, 1e-5], [(1, 1), (3, 33)]),
        "softmax": ("aten._safe_softmax.default", [torch.randn(2, 2, 16, 16), -1],
                    lambda s: [torch.randn(*s), -1], [(1, 1, 1, 1), (3, 2, 33, 33), (1, 5, 9, 17)]),
        "softmax_backward": ("aten._softmax_backward_data.default",
                             [torch.randn(2, 2, 16, 16), torch.softmax(torch.randn(2, 2, 16, 16), -1), -1, torch.float32],
                             lambda s: [torch.randn(*s), torch.softmax(torch.randn(*s), -1), -1, torch.float32],
                             [(1, 1, 1, 1), (3, 2, 33, 33), (1, 5, 9, 17)]),
    }


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_rule_kernels_declare_their_rule_and_take_other_sizes(backend):
    """The declared dimensions vary at run time (the same results as eager at sizes the card did
    not have: the batch of an elementwise operator, the rows of a layer or RMS norm, the outer dimensions of a reduction, every dimension of a
    softmax, the batch and channels of a pooling); a dimension the rule fixes is still refused."""
    from modulelens.kernels.shape_rules import declared_rule

    for name, (op, sample, make, shapes) in _rule_cases().items():
        ks = T.render(T.synthetic_card(op, sample), backend, 0)
        rule = declared_rule(ks.source)
        assert rule is not None and ks.params["variable_dims"] == rule.text(), name
        fn = get_backend(backend).load(ks.source, ks.entry, default_build_dir())
        aten = resolve_op(op)
        for shape in shapes:
            args = make(shape)
            _compare(fn(*args), aten(*args))
        if name == "layer_norm":
            with pytest.raises((RuntimeError, ValueError), match="specialised for shape"):
                fn(torch.randn(2, 16, 32), [32], torch.randn(32), torch.randn(32), 1e-5)
        if name == "pooling":  # the spatial sizes (the bins) stay as validated
            with pytest.raises((RuntimeError, ValueError), match="specialised for shape"):
                fn(torch.randn(2, 3, 11, 7), [3, 5])


def test_a_non_contiguous_sample_gets_no_rule():
    x = torch.randn(16, 2, 64).transpose(0, 1)
    card = T.synthetic_card("aten.native_layer_norm.default", [x, [64], None, None, 1e-5])
    assert "variable_dims" not in T.render(card, "cpp").params


# ---------------------------------------------------------------------------------------------
# Triton: every family, under the interpreter without a GPU (the backend sets TRITON_INTERPRET=1).

def _triton_cases():
    x4 = _x4()
    cl = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    nc = torch.randn(8, 32, 4, 16).permute(0, 2, 1, 3)
    return {
        "gelu": ("aten.gelu.default", [torch.randn(4, 300) * 3], {}),
        "gelu_tanh": ("aten.gelu.default", [torch.randn(4, 300) * 3], {"approximate": "tanh"}),
        "silu": ("aten.silu.default", [_special((4, 100))], {}),
        "add_bcast": ("aten.add.Tensor", [x4, torch.randn(32, 32)], {"alpha": 2}),
        "mul_scalar_nc": ("aten.mul.Scalar", [nc, 0.5], {}),
        "softmax": ("aten._safe_softmax.default", [_neg_inf_rows(x4), -1], {}),
        "softmax_backward": ("aten._softmax_backward_data.default",
                             [torch.randn(2, 4, 16, 16), torch.softmax(torch.randn(2, 4, 16, 16), -1), -1, torch.float32],
                             {}),
        "layer_norm": ("aten.native_layer_norm.default", [torch.randn(8, 32, 64), [64], torch.randn(64), torch.randn(64), 1e-5], {}),
        "rms_norm": ("aten._fused_rms_norm.default", [torch.randn(8, 32, 64), [64], None, None], {}),
        "group_norm": ("aten.native_group_norm.default", [torch.randn(2, 8, 5, 3), None, torch.randn(8), 2, 8, 15, 2, 1e-5], {}),
        "sum": ("aten.sum.dim_IntList", [torch.randn(8, 32, 64), [-1]], {}),
        "mean_keepdim": ("aten.mean.dim", [torch.randn(8, 32, 64), [1], True], {}),
        "amax_nan": ("aten.amax.default", [_neg_inf_rows(x4), [-1, -2]], {}),
        "pool_channels_last": ("aten._adaptive_avg_pool2d.default", [cl, [3, 5]], {}),
    }


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy under the interpreter: exp overflow, inf - inf
@pytest.mark.parametrize("name", list(_triton_cases()))
def test_triton_templates(name):
    op, args, kwargs = _triton_cases()[name]
    if HAS_CUDA:
        args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    card = T.synthetic_card(op, args, kwargs)
    n = T.variants(card, "triton")
    assert n >= 2
    for v in sorted({0, n - 1}):  # the default and the last variant (the looped kernels for row families)
        _check("triton", op, args, [], kwargs, variant=v, rtol=1.3e-6, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# CUDA: compile-checked with nvcc here; run on a GPU.

def _cuda_cards():
    h = torch.float16
    return {
        "elementwise": T.synthetic_card("aten.add.Tensor", [torch.randn(8, 4, 32, 32).to(h), torch.randn(32, 32).to(h)], {"alpha": 2}),
        "softmax": T.synthetic_card("aten._safe_softmax.default", [torch.randn(8, 4, 32, 32), -1]),
        "layer_norm": T.synthetic_card("aten.native_layer_norm.default", [torch.randn(8, 32, 64), [64], torch.randn(64), torch.randn(64), 1e-5]),
        "rms_norm": T.synthetic_card("aten._fused_rms_norm.default", [torch.randn(8, 32, 64).bfloat16(), [64], torch.randn(64).bfloat16(), 1e-6]),
        "softmax_backward": T.synthetic_card("aten._softmax_backward_data.default",
                                             [torch.randn(2, 4, 16, 16), torch.rand(2, 4, 16, 16), -1, torch.float32]),
    }


@pytest.mark.skipif(HAS_CUDA or not HAS_NVCC, reason="compile-only check: for machines with nvcc and no GPU")
def test_cuda_templates_compile():
    """Every cuda template compiles with nvcc (two nvcc processes at a time: ~15 s each)."""
    from concurrent.futures import ThreadPoolExecutor

    cuda = get_backend("cuda")
    sources = {family: T.render(card, "cuda") for family, card in _cuda_cards().items()}
    assert all(ks.family == family for family, ks in sources.items())
    with ThreadPoolExecutor(max_workers=2) as pool:
        logs = dict(zip(sources, pool.map(lambda ks: cuda.compile_only(ks.source, default_build_dir()), sources.values())))
    assert all("compiled" in log for log in logs.values()), logs


@gpu
@needs_gpu
@pytest.mark.parametrize("case", ["gelu", "add_bcast", "softmax", "layer_norm", "rms_norm"])
def test_cuda_templates_run(case):
    op, args, kwargs = _triton_cases()[case]
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    _check("cuda", op, args, [], kwargs, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Errors and the library's surface

def test_no_template_fits():
    card = T.synthetic_card("aten.addmm.default", [torch.randn(4), torch.randn(3, 5), torch.randn(5, 4)])
    assert T.match(card) is None and T.variants(card, "cpp") == 0
    with pytest.raises(ModuleLensError) as e:
        T.render(card, "cpp")
    assert "no template fits aten.addmm.default" in e.value.message
    for family in ("elementwise", "softmax", "layer_norm", "rms_norm", "group_norm", "reduction", "pooling"):
        assert family in e.value.hint


def test_softmax_over_another_dim_does_not_match():
    card = T.synthetic_card("aten._softmax.default", [torch.randn(4, 8, 16), 1, False])
    assert T.match(card) is None
    assert "dim 1" in T.why_not(card)
    with pytest.raises(ModuleLensError, match="last dimension"):
        T.render(card, "triton")


def test_unsupported_dtype_and_missing_backend():
    half = T.synthetic_card("aten.gelu.default", [torch.randn(4, 8).half()])
    assert T.match(half) is not None and T.variants(half, "cpp") == 0 and T.variants(half, "triton") > 0
    with pytest.raises(ModuleLensError) as e:
        T.render(half, "cpp")
    assert "float16" in e.value.message and "float32, float64" in e.value.hint
    gn = T.synthetic_card("aten.native_group_norm.default", [torch.randn(2, 4, 3, 3), None, None, 2, 4, 9, 2, 1e-5])
    with pytest.raises(ModuleLensError) as e:
        T.render(gn, "cuda")
    assert "no cuda template" in e.value.message and "cpp, triton" in e.value.hint
    with pytest.raises(ModuleLensError, match="variant 99"):
        T.render(T.synthetic_card("aten.relu.default", [torch.randn(3)]), "cpp", 99)


def test_in_place_operators_are_not_templated():
    card = T.synthetic_card("aten.div_.Scalar", [torch.randn(4, 4), 0.9])
    assert T.match(card) is None


def test_match_params_and_families():
    card = T.synthetic_card("aten.native_layer_norm.default", [torch.randn(8, 32, 64), [64], None, torch.randn(64), 1e-5])
    m = T.match(card)
    assert m.family == "layer_norm" and m.params["C"] == 64 and m.params["rows"] == 256
    assert m.params["stat_shape"] == [8, 32, 1] and m.params["has_weight"] is False and m.params["eps"] == 1e-5
    fams = T.families()
    assert set(fams) == {"elementwise", "softmax", "softmax_backward", "layer_norm", "rms_norm", "group_norm",
                         "reduction", "pooling"}
    assert fams["softmax"]["backends"] == ["cpp", "triton", "cuda"] and "cuda" not in fams["pooling"]["backends"]
    g = T.match(T.synthetic_card("aten.gelu.default", [torch.randn(4)], {"approximate": "tanh"}))
    assert g.params["approximate"] == "tanh"


def test_real_card_fields_are_understood():
    """A card as capture_ops writes it (structure from the stored sample, kwargs in stored order)."""
    x = torch.randn(8, 4, 32, 32)
    card = T.synthetic_card("aten._safe_softmax.default", [x, -1])
    assert card["shapes"] == [[8, 4, 32, 32]] and card["args"] == [-1] and card["samples"][0]["args"]["$"] == "list"
    ks = T.render(card, "cpp")
    assert "forward(const at::Tensor& self, int64_t dim)" in ks.source


# ---------------------------------------------------------------------------------------------
# Backends

def test_backend_status_and_describe():
    cpp, triton, cuda = (get_backend(n) for n in ("cpp", "triton", "cuda"))
    assert cpp.status().can_run and cpp.status().can_time
    assert "-O3" in cpp.describe()["cflags"] and cpp.describe()["torch"] == torch.__version__
    st = triton.status()
    assert st.can_run and st.can_time == HAS_CUDA
    if not HAS_CUDA:
        assert "TRITON_INTERPRET=1" in st.why
        assert cuda.status().can_run is False and "not run" in cuda.status().why
    assert "triton" in triton.describe() and "nvcc" in cuda.describe()


def test_cpp_compile_error_is_short_and_quiet(tmp_path, capfd):
    src = ("// modulelens: no-implicit-headers\n"
           "int forward(int x) {\n"
           "  return undefined_thing + x;\n"
           "}\n")
    with pytest.raises(CompileError) as e:
        get_backend("cpp").load(src, "forward", tmp_path)
    assert e.value.message.startswith("<source>:3:")
    assert "undefined_thing" in e.value.message and len(e.value.message.splitlines()) <= 4
    assert "main.cpp" not in e.value.message and "main.cpp" in e.value.log
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # the build's output does not leak
    with pytest.raises(CompileError) as again:  # remembered, not rebuilt
        get_backend("cpp").load(src, "forward", tmp_path)
    assert again.value.message == e.value.message


def test_triton_errors(tmp_path):
    tb = get_backend("triton")
    with pytest.raises(CompileError, match=r"<source>:2:\d+: SyntaxError"):
        tb.load("import torch\ndef forward(x:\n    return x\n", "forward", tmp_path)
    with pytest.raises(CompileError, match=r"<source>:2: NameError"):
        tb.load("import torch\nundefined_name\n", "forward", tmp_path)
    with pytest.raises(CompileError, match="defines no callable `forward`"):
        tb.load("x = 1\n", "forward", tmp_path)
    fn = tb.load("def forward(x):\n    return x + 1\n", "forward", tmp_path)
    assert fn(1) == 2


@pytest.mark.skipif(not HAS_NVCC, reason="needs nvcc")
def test_cuda_compile_error_is_short(tmp_path):
    src = ("// modulelens: no-implicit-headers\n"
           "__global__ void k(float* y) {\n"
           "  y[0] = undefined_value;\n"
           "}\n")
    with pytest.raises(CompileError) as e:
        get_backend("cuda").compile_only(src, tmp_path)
    assert e.value.message.startswith("<source>:3:") and "undefined_value" in e.value.message


def test_cuda_declaration_is_taken_from_the_source():
    from modulelens.kernels.backends.cuda import declaration

    src = "__global__ void k() {}\nstd::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x,\n    double eps) {\n  return {x, x};\n}\n"
    assert declaration(src, "forward") == "std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x,\n    double eps);"
    with pytest.raises(CompileError, match="could not find the definition"):
        declaration("int main() { return forward(1); }", "forward")
