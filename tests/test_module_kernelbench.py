"""KernelBench-style problems (``Model``, ``get_inputs``, ``get_init_inputs``) captured from their
files, each with a correct custom ``ModelNew``, a wrong one and a wrapper: a norm, a convolution
followed by a group norm (badly conditioned: eager itself is off), and a scaled matrix product.

What each verdict rests on: fresh parameters expose a LayerNorm that ignores its affine weights;
a float64 computation more accurate than eager is accepted with both errors reported; a C++
extension calling ``at::cpu::mul`` past the dispatcher is a wrapper naming the symbol; a custom
kernel is custom because it stays correct where the reference library is denied. And a module
with a 256 MiB output validates within the default memory limit; below what it needs, the answer
names the size and the option, never an internal error.

C++ builds are slow: only two problems use one (the LayerNorm custom, built in its run and again in
its denial run, and the matrix wrapper); the others are Python-level candidates.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import modulelens
from modulelens.errors import ModuleLensError
from modulelens.registry import ToolContext
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

pytestmark = pytest.mark.slow

PROBLEMS = {
    "layernorm": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, normalized_shape):
                super().__init__()
                self.ln = nn.LayerNorm(normalized_shape)

            def forward(self, x):
                return self.ln(x)

        def get_inputs():
            return [torch.randn(4, 8, 64)]

        def get_init_inputs():
            return [64]
    """,
    "conv_groupnorm": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size, groups):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
                self.norm = nn.GroupNorm(groups, out_channels)

            def forward(self, x):
                return self.norm(self.conv(x))

        def get_inputs():
            # nearly constant images: each group's statistics cancel, and float32 eager is off by ~1e-4
            return [10.0 + 0.01 * torch.randn(2, 3, 8, 8)]

        def get_init_inputs():
            return [3, 4, 3, 4]
    """,
    "scaled_matmul": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.scale = nn.Parameter(torch.ones(n))

            def forward(self, a, b):
                return torch.matmul(a, b) * self.scale

        def get_inputs():
            return [torch.randn(8, 16), torch.randn(16, 12)]

        def get_init_inputs():
            return [12]
    """,
    "outer": """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, a, b):
                return a[:, None] * b[None, :]

        def get_inputs():
            return [torch.randn(8192), torch.randn(8192)]  # a 256 MiB output

        def get_init_inputs():
            return []
    """,
}

LAYERNORM_INIT = """def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)
"""
LAYERNORM_CPP = r'''
// modulelens: no-implicit-headers
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
#include <cmath>

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  at::Tensor in = x.contiguous(), out = at::empty_like(in);
  const int64_t cols = in.size(-1), rows = in.numel() / cols;
  const float *px = in.data_ptr<float>(), *pw = weight.data_ptr<float>(), *pb = bias.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = px + r * cols;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += row[c];
    mean /= cols;
    for (int64_t c = 0; c < cols; ++c) var += (row[c] - mean) * (row[c] - mean);
    const double inv = 1.0 / std::sqrt(var / cols + eps);
    for (int64_t c = 0; c < cols; ++c) po[r * cols + c] = static_cast<float>((row[c] - mean) * inv * pw[c] + pb[c]);
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("layer_norm", &layer_norm); }
'''
MATMUL_CPP = r'''
// modulelens: no-implicit-headers
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <torch/csrc/utils/pybind.h>

at::Tensor scaled_matmul(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale) {
  at::Tensor A = a.contiguous(), B = b.contiguous();
  const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
  at::Tensor out = at::empty({M, N}, A.options());
  const float *pa = A.data_ptr<float>(), *pb = B.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += pa[i * K + k] * pb[k * N + j];
      po[i * N + j] = acc;
    }
  return at::cpu::mul(out, scale);  // the scaling by ATen's own CPU kernel, past the dispatcher
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scaled_matmul", &scaled_matmul); }
'''

CANDIDATES = {
    ("layernorm", "custom"): '''
        from torch.utils.cpp_extension import load_inline

        CPP = r"""LAYERNORM_CPP"""
        _ext = load_inline(name="kb_layer_norm_v1", cpp_sources=[CPP], extra_cflags=["-O1"],
                           no_implicit_headers=True, verbose=False)

        class ModelNew(nn.Module):
            LAYERNORM_INIT
            def forward(self, x):
                return _ext.layer_norm(x, self.ln.weight, self.ln.bias, self.ln.eps)
    ''',
    ("layernorm", "wrong"): '''
        import math

        class ModelNew(nn.Module):  # normalises each row, but forgets the affine weight and bias
            LAYERNORM_INIT
            def forward(self, x):
                out = []
                for row in x.reshape(-1, x.shape[-1]).tolist():
                    mean = math.fsum(row) / len(row)
                    inv = 1.0 / math.sqrt(math.fsum((v - mean) ** 2 for v in row) / len(row) + self.ln.eps)
                    out.append([(v - mean) * inv for v in row])
                return torch.tensor(out, dtype=x.dtype).reshape(x.shape)
    ''',
    ("layernorm", "wrapper"): '''
        class ModelNew(nn.Module):
            LAYERNORM_INIT
            def forward(self, x):
                return nn.functional.layer_norm(x, self.ln.normalized_shape, self.ln.weight, self.ln.bias, self.ln.eps)
    ''',
    ("conv_groupnorm", "custom"): '''
        import math

        class ModelNew(nn.Module):  # convolution and group norm in float64 (Python floats), rounded once
            def __init__(self, in_channels, out_channels, kernel_size, groups):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
                self.norm = nn.GroupNorm(groups, out_channels)

            def forward(self, x):
                w, b = self.conv.weight.tolist(), self.conv.bias.tolist()
                gamma, beta = self.norm.weight.tolist(), self.norm.bias.tolist()
                groups, eps = self.norm.num_groups, self.norm.eps
                cout, cin, k = len(w), len(w[0]), len(w[0][0])
                out = []
                for img in x.tolist():
                    ho, wo = len(img[0]) - k + 1, len(img[0][0]) - k + 1
                    y = [[[b[o] + math.fsum(w[o][c][i][j] * img[c][r + i][s + j]
                                            for c in range(cin) for i in range(k) for j in range(k))
                           for s in range(wo)] for r in range(ho)] for o in range(cout)]
                    per = cout // groups
                    for g in range(groups):
                        chans = range(g * per, (g + 1) * per)
                        vals = [v for o in chans for row in y[o] for v in row]
                        mean = math.fsum(vals) / len(vals)
                        inv = 1.0 / math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / DIVISOR + eps)
                        for o in chans:
                            y[o] = [[(v - mean) * inv * gamma[o] + beta[o] for v in row] for row in y[o]]
                    out.append(y)
                return torch.tensor(out, dtype=x.dtype)
    ''',
    ("conv_groupnorm", "wrapper"): '''
        class ModelNew(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size, groups):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
                self.norm = nn.GroupNorm(groups, out_channels)

            def forward(self, x):
                return self.norm(self.conv(x))
    ''',
    ("scaled_matmul", "custom"): '''
        import math

        class ModelNew(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.scale = nn.Parameter(torch.ones(n))

            def forward(self, a, b):
                A, B, s = a.tolist(), b.tolist(), self.scale.tolist()
                out = [[math.fsum(A[i][k] * B[k][j] for k in range(LAST)) * s[j] for j in range(len(s))]
                       for i in range(len(A))]
                return torch.tensor(out, dtype=a.dtype)
    ''',
    ("scaled_matmul", "wrapper"): '''
        from torch.utils.cpp_extension import load_inline

        CPP = r"""MATMUL_CPP"""
        _ext = load_inline(name="kb_scaled_matmul_v1", cpp_sources=[CPP], extra_cflags=["-O1"],
                           no_implicit_headers=True, verbose=False)

        class ModelNew(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.scale = nn.Parameter(torch.ones(n))

            def forward(self, a, b):
                return _ext.scaled_matmul(a, b, self.scale)
    ''',
}
# the wrong ones differ from a custom one by a detail: an unbiased variance, an off-by-one reduction
CANDIDATES[("conv_groupnorm", "wrong")] = CANDIDATES[("conv_groupnorm", "custom")].replace("DIVISOR", "(len(vals) - 1)")
CANDIDATES[("conv_groupnorm", "custom")] = CANDIDATES[("conv_groupnorm", "custom")].replace("DIVISOR", "len(vals)")
CANDIDATES[("scaled_matmul", "wrong")] = CANDIDATES[("scaled_matmul", "custom")].replace("LAST", "len(B) - 1")
CANDIDATES[("scaled_matmul", "custom")] = CANDIDATES[("scaled_matmul", "custom")].replace("LAST", "len(B)")


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """Each problem file captured once, as a KernelBench file (``Model(*get_init_inputs())`` called
    on ``get_inputs()`` by the capture worker): name -> (repository, capture ref)."""
    repo = tmp_path_factory.mktemp("kernelbench-modules")
    refs = {}
    for name, text in PROBLEMS.items():
        path = repo.parent / f"{repo.name}-{name}.py"
        path.write_text(textwrap.dedent(text))
        refs[name] = modulelens.capture_module(str(path), name=name, repo=str(repo)).ref
    return repo, refs


# The Python-float candidates sum with math.fsum, which raises where a float sum of +inf and -inf is
# NaN (validation's edge cases put infinities in the inputs): they sum through this instead.
FSUM = """
import math


def _fsum(terms):
    terms = list(terms)
    try:
        return math.fsum(terms)
    except ValueError:  # +inf and -inf among the terms
        return math.nan
"""


def _source(text: str) -> str:
    """A candidate's full source: the imports, the text dedented, then the C++ and shared parts put in."""
    text = textwrap.dedent(text).replace("LAYERNORM_INIT", LAYERNORM_INIT)
    head = "import torch\nimport torch.nn as nn\n" + (FSUM if "math.fsum(" in text else "")
    return head + text.replace("math.fsum(", "_fsum(").replace("LAYERNORM_CPP", LAYERNORM_CPP).replace(
        "MATMUL_CPP", MATMUL_CPP)


def _validate(problems, name: str, kind: str | None = None, source: str | None = None, **kw):
    repo, refs = problems
    text = _source(source or CANDIDATES[(name, kind)])
    req = ValidateKernelRequest(source_text=text, target=refs[name], seeds=1, time=False, **kw)
    return validate_kernel(req, ToolContext(repo_root=Path(repo)))


@pytest.mark.parametrize("name", ["layernorm", "scaled_matmul"])  # conv_groupnorm's: the accuracy test below
def test_a_correct_custom_kernel_is_custom_because_it_computes_where_torch_is_denied(problems, name):
    r = _validate(problems, name, "custom")
    assert r.verdict == "custom" and r.correct, r.reason
    assert r.denial is not None and r.denial.outcome == "computes itself", r.denial
    assert "kernels of computing operators raise" in r.denial.denied
    assert not r.backend_calls and r.varied, (r.backend_calls, r.varied)


def test_a_layernorm_that_ignores_its_weights_is_rejected_by_fresh_parameters(problems):
    r = _validate(problems, "layernorm", "wrong")
    assert r.verdict == "rejected" and not r.correct, r.reason
    # the captured LayerNorm has weight 1 and bias 0: only the fresh draw exposes it, and the reason says which
    assert "fresh parameters" in r.reason and "ln.weight" in r.reason and "ln.bias" in r.reason, r.reason
    assert all(c.passed for c in r.checks if "fresh parameters" not in c.name), [c for c in r.checks if not c.passed]
    assert set(r.varied) == {"ln.weight", "ln.bias"} and "random signs" in r.varied_how


@pytest.mark.parametrize("name, why", [("conv_groupnorm", "values outside tolerance"),
                                       ("scaled_matmul", "values outside tolerance")])
def test_a_subtly_wrong_kernel_is_rejected_even_against_the_oracle(problems, name, why):
    r = _validate(problems, name, "wrong")
    assert r.verdict == "rejected" and why in r.reason, r.reason
    if name == "conv_groupnorm":  # eager is off here, so the oracle was asked, and still says no
        assert "still rejected" in r.reason and any(not a.accepted for a in r.accuracy), r.accuracy


def test_a_kernel_more_accurate_than_eager_is_accepted_with_both_errors(problems):
    r = _validate(problems, "conv_groupnorm", "custom")
    assert r.correct and r.verdict == "custom", r.reason
    assert r.denial is not None and r.denial.outcome == "computes itself", r.denial
    accepted = [a for a in r.accuracy if a.accepted and a.case.endswith("captured inputs")]
    assert accepted, r.accuracy
    a = accepted[0]
    assert a.eager_max_abs > 1e-5 > 1e-6 > a.candidate_max_abs, a  # eager ~1e-4 away from float64, the candidate ~1e-7
    assert any("against the float64 oracle" in w for w in r.warnings), r.warnings


@pytest.mark.parametrize("name, calls", [("layernorm", "aten::native_layer_norm"),
                                         ("conv_groupnorm", "aten::convolution"),
                                         ("scaled_matmul", "at::cpu::mul")])
def test_a_wrapper_is_a_wrapper_naming_what_it_calls(problems, name, calls):
    r = _validate(problems, name, "wrapper")
    assert r.verdict == "wrapper" and r.correct, r.reason
    assert any(calls in c for c in r.backend_calls), r.backend_calls
    assert r.denial is None  # the evidence was enough: no denial run


def test_a_256_mib_output_validates_within_the_default_memory_limit(problems):
    r = _validate(problems, "outer", source="""
        class ModelNew(nn.Module):
            def forward(self, a, b):
                return torch.outer(a, b)
        """)
    assert r.correct and r.verdict == "wrapper", r.reason


def test_too_little_memory_is_a_clear_error_naming_the_size_and_the_option(problems):
    with pytest.raises(ModuleLensError) as e:
        _validate(problems, "outer", source="""
            class ModelNew(nn.Module):
                def forward(self, a, b):
                    return torch.outer(a, b)
            """, memory_limit_mb=1536)
    text = str(e.value)
    assert "1536 MB" in text and "256 MiB" in text and "internal error" not in text, text
    assert e.value.rendered("cli")[1] == "raise it with --memory-limit-mb 3072", e.value.rendered("cli")
