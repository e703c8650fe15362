"""Partial fusion: a module candidate that keeps declared library operators (matrix products) and
computes the rest itself is ``custom``, naming what it keeps and what it computes itself; the same
code without the declaration, or one that computes nothing itself, is a ``wrapper``."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from conftest import EXAMPLES, validate_source

import modulelens
from modulelens.kernels import declared_library_ops

pytestmark = pytest.mark.slow

# A fused-MLP ModelNew for the example's MLP (examples/tinyformer/model.py): torch's matrix
# products, its own bias add + GELU in one C++ loop, with its own backward.
FUSED_MLP = textwrap.dedent(r'''
    {header}
    import torch
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    CPP = r"""
    // modulelens: no-implicit-headers
    #include <ATen/core/Tensor.h>
    #include <ATen/ops/empty_like.h>
    #include <torch/csrc/utils/pybind.h>
    #include <cmath>

    at::Tensor bias_gelu(const at::Tensor& h, const at::Tensor& b) {
      TORCH_CHECK(h.scalar_type() == at::kFloat && h.is_contiguous() && b.is_contiguous(), "float, contiguous");
      at::Tensor out = at::empty_like(h);
      const int64_t n = b.numel(), rows = h.numel() / n;
      const float* hp = h.data_ptr<float>(); const float* bp = b.data_ptr<float>(); float* op = out.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) {
          const float v = hp[r * n + j] + bp[j];
          op[r * n + j] = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
        }
      return out;
    }

    std::vector<at::Tensor> bias_gelu_backward(const at::Tensor& g, const at::Tensor& h, const at::Tensor& b) {
      at::Tensor gc = g.contiguous();
      at::Tensor gh = at::empty_like(h), gb = at::empty_like(b);
      const int64_t n = b.numel(), rows = h.numel() / n;
      const float* gp = gc.data_ptr<float>(); const float* hp = h.data_ptr<float>(); const float* bp = b.data_ptr<float>();
      float* ghp = gh.data_ptr<float>(); float* gbp = gb.data_ptr<float>();
      for (int64_t j = 0; j < n; ++j) gbp[j] = 0.0f;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < n; ++j) {
          const float v = hp[r * n + j] + bp[j];
          const float cdf = 0.5f * (1.0f + std::erf(v * 0.70710678118654752f));
          const float pdf = 0.39894228040143268f * std::exp(-0.5f * v * v);
          const float d = gp[r * n + j] * (cdf + v * pdf);
          ghp[r * n + j] = d;
          gbp[j] += d;
        }
      return {gh, gb};
    }

    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
      m.def("bias_gelu", &bias_gelu);
      m.def("bias_gelu_backward", &bias_gelu_backward);
    }
    """

    _ext = load_inline(name="partial_fusion_mlp_v1", cpp_sources=[CPP], extra_cflags=["-O2"],
                       no_implicit_headers=True, verbose=False)


    class _BiasGelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, b):
            ctx.save_for_backward(h, b)
            return _ext.bias_gelu(h, b)

        @staticmethod
        def backward(ctx, g):
            h, b = ctx.saved_tensors
            gh, gb = _ext.bias_gelu_backward(g, h, b)
            return gh, gb


    class ModelNew(nn.Module):
        def __init__(self, dim, hidden, activation, dropout):
            super().__init__()
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, dim)
            self.drop = nn.Dropout(dropout)

        def forward(self, x):
            rows = x.reshape(-1, x.shape[-1])
            h = torch.mm(rows, self.fc1.weight.t())
            y = torch.addmm(self.fc2.bias, _BiasGelu.apply(h, self.fc1.bias), self.fc2.weight.t())
            y = y.reshape(*x.shape[:-1], y.shape[-1])
            return self.drop(y) if self.training and self.drop.p > 0 else y  # as eager: no dropout draw at p=0
''')
HEADER = "# modulelens-library-ops: aten.mm, aten.addmm"


def _example_mlp():
    sys.path.insert(0, str(EXAMPLES / "tinyformer"))
    try:
        import model

        return model.MLP(16, 64, model.Activation.GELU, 0.0)
    finally:
        sys.path.remove(str(EXAMPLES / "tinyformer"))


@pytest.fixture(scope="module")
def mlp_repo(tmp_path_factory):
    """A repository holding ``mlp`` (the example's MLP, dim 16, hidden 64, dropout 0, captured in
    training with its gradients on [2, 6, 16]) and ``proj`` (a bias-free nn.Linear on [4, 16])."""
    repo = tmp_path_factory.mktemp("mlp-repo")
    with modulelens.capture("", name="mlp", repo=repo, backward=True, export=False):
        _example_mlp().train()(torch.randn(2, 6, 16, requires_grad=True)).pow(2).sum().backward()
    with modulelens.capture("", name="proj", repo=repo, export=False):
        torch.nn.Linear(16, 16, bias=False)(torch.randn(4, 16))
    return repo


def test_header_declares_only_keepable_library_ops():
    d = declared_library_ops("# modulelens-library-ops: aten.addmm, aten::bmm aten.gelu\nx = 1\n")
    assert d.kept == ["aten::addmm", "aten::bmm"] and d.keeps("aten::addmm") and not d.keeps("aten::gelu")
    assert d.refused and "aten.gelu" in d.refused[0] and "own work" in d.refused[0]
    assert declared_library_ops("import torch\n").kept == []


@pytest.fixture(scope="module")
def fused_mlp(mlp_repo):
    """The fused MLP validated (training claimed) against ``mlp``."""
    return validate_source(mlp_repo, FUSED_MLP.replace("{header}", HEADER), target="mlp", claims_training=True)


def test_fused_mlp_keeping_torch_matmuls_is_custom_and_names_them(fused_mlp):
    r = fused_mlp
    assert r.correct and r.verdict == "custom", r.reason
    assert "same RNG state" in r.reason, r.reason  # checked in training mode too
    assert r.library_ops == ["aten::mm", "aten::addmm"], r.library_ops
    assert "aten::gelu" in r.computes_itself, r.computes_itself
    assert "aten::addmm" in r.reason and "aten::gelu" in r.reason, r.reason
    assert r.denial is not None and r.denial.outcome == "computes itself"
    assert "but the declared library operators aten::mm, aten::addmm" in r.denial.denied


def test_the_same_fused_mlp_without_the_header_is_a_wrapper(mlp_repo):
    r = validate_source(mlp_repo, FUSED_MLP.replace("{header}", ""), target="mlp")
    assert r.correct and r.verdict == "wrapper", r.reason
    assert "aten::addmm" in r.reason and r.denial is None


def test_an_undeclared_library_call_or_nothing_computed_itself_is_a_wrapper(mlp_repo):
    body = """
        import torch
        import torch.nn as nn

        class ModelNew(nn.Module):
            def __init__(self, *a, **k):
                super().__init__()
                self.weight = nn.Parameter(torch.empty(16, 16))

            def forward(self, x):
                return {expr}
    """
    only_mm = validate_source(mlp_repo, HEADER + textwrap.dedent(body.format(expr="torch.mm(x, self.weight.t())")),
                              target="proj")
    assert only_mm.correct and only_mm.verdict == "wrapper", only_mm.reason
    assert "computes nothing itself" in only_mm.reason, only_mm.reason
    bmm = validate_source(mlp_repo, "# modulelens-library-ops: aten.addmm, aten.gelu" + textwrap.dedent(
        body.format(expr="torch.bmm(x[None], self.weight.t()[None])[0]")), target="proj")
    assert bmm.correct and bmm.verdict == "wrapper", bmm.reason
    assert "aten::bmm" in bmm.reason and "not declared" in bmm.reason and "aten.gelu" in bmm.reason, bmm.reason


def _pack(repo, candidate_id):
    from modulelens.registry import ToolContext
    from modulelens.tools.pack import PackRequest, pack

    return pack(PackRequest(candidates=[candidate_id], force=True), ToolContext(repo_root=repo)).path


def _train_steps(net, steps=2):
    for _ in range(steps):
        net(torch.randn(3, 5, 16)).pow(2).sum().backward()


def test_packed_entry_loads_the_verified_build_and_counts_backward_hits(mlp_repo, fused_mlp, tmp_path, monkeypatch):
    assert fused_mlp.verdict == "custom", fused_mlp.reason
    assert [x.name for x in fused_mlp.extensions] == ["partial_fusion_mlp_v1"], fused_mlp.extensions
    path = _pack(mlp_repo, fused_mlp.candidate_id)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))
    torch.manual_seed(3)
    net, eager = _example_mlp().train(), _example_mlp().train()
    eager.load_state_dict(net.state_dict())
    applied = modulelens.apply_pack(net, path)
    try:
        x = torch.randn(2, 6, 16)  # the captured shape (no shape rule declared)
        got, want = net(x), eager(x)
        torch.testing.assert_close(got, want)
        got.pow(2).sum().backward()
        want.pow(2).sum().backward()
        torch.testing.assert_close(net.fc1.bias.grad, eager.fc1.bias.grad)
        net(x).sum().backward()
        entry = applied.report().entries[0]
    finally:
        applied.remove()
    assert entry.hits_by_phase == {"forward": 2, "backward": 2}, entry
    assert entry.builds == [f"partial_fusion_mlp_v1: the verified build {fused_mlp.extensions[0].address}"], entry.builds
    assert not (tmp_path / "torch_extensions").exists()  # nothing compiled in this run


def test_a_missing_build_is_built_before_the_run_into_the_build_cache(mlp_repo, fused_mlp, tmp_path, monkeypatch):
    from modulelens.dispatch.builds import prepare_builds

    path = _pack(mlp_repo, fused_mlp.candidate_id)
    cache = tmp_path / "other-cache"  # a machine where validation did not run: no verified build here
    monkeypatch.setenv("MODULELENS_BUILD_DIR", str(cache))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))
    said: list[str] = []
    built = prepare_builds(path, said.append)
    assert built == [f"{fused_mlp.candidate_id}: partial_fusion_mlp_v1"] and "before the script starts" in said[0]
    assert prepare_builds(path, said.append) == []  # built once
    net = _example_mlp().train()
    applied = modulelens.apply_pack(net, path)
    try:
        net(torch.randn(2, 6, 16)).sum().backward()
        entry = applied.report().entries[0]
    finally:
        applied.remove()
    # (this process loaded the extension already, from the verified build: see the test above)
    assert entry.builds and entry.builds[0].startswith("partial_fusion_mlp_v1: ")
    assert list((cache / "packs").glob("ml_mod_*/partial_fusion_mlp_v1*.so")), list(cache.rglob("*"))[:20]
    assert entry.hits_by_phase == {"forward": 1, "backward": 1}, entry
    assert not (tmp_path / "torch_extensions").exists()
