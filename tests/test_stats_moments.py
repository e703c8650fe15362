"""Pure logic of modulelens.stats.stats: moment vectors, exact merging, sampling, finalizing."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats as sps

from modulelens.stats import fused
from modulelens.stats import stats as S


@pytest.fixture
def torch_path(monkeypatch):
    """Statistics computed with PyTorch operators (the path without a C compiler, and of GPUs)."""
    monkeypatch.setattr(S, "moments_cpu", lambda *args: None)


def _finalized(t: torch.Tensor, sample: int | None = None) -> dict:
    return S.tensor_stats(t, sample=sample)


@pytest.mark.parametrize("split", [[1, 999], [500, 500], [3, 300, 697]])
def test_merge_of_parts_equals_the_whole(split):
    torch.manual_seed(0)
    x = torch.randn(1000, dtype=torch.float64).exp()  # skewed: every central moment matters
    parts = torch.split(x, split)
    merged = S.merge_all(S.to_host([S.moments(p) for p in parts]))
    whole = S.to_host([S.moments(x)])[0]
    assert merged == pytest.approx(whole, rel=1e-9, abs=1e-9)


def test_merge_with_an_empty_vector_keeps_the_other():
    v = S.to_host([S.moments(torch.tensor([1.0, 2.0, 4.0]))])[0]
    empty = S.to_host([S.moments(torch.tensor([]))])[0]
    assert S.merge(empty, v)[1:6] == v[1:6] and S.merge(v, empty)[1:6] == v[1:6]


def test_finalize_matches_scipy_on_finite_values():
    torch.manual_seed(1)
    x = torch.randn(4096, dtype=torch.float64) * 3 + 1
    x[::97] = float("nan")
    x[5] = float("inf")
    st = _finalized(x)
    fin = x[torch.isfinite(x)].numpy()
    assert st["nan"] == 43 and st["inf"] == 1 and st["count"] == fin.size
    assert st["std"] == pytest.approx(fin.std(), rel=1e-10)
    assert st["skew"] == pytest.approx(sps.skew(fin, bias=True), rel=1e-8, abs=1e-12)
    assert st["kurtosis"] == pytest.approx(sps.kurtosis(fin, fisher=True, bias=True), rel=1e-8)
    assert st["rms"] == pytest.approx(math.sqrt((fin**2).mean()), rel=1e-10)


def test_constant_tensor_has_no_shape_statistics():
    st = _finalized(torch.full((100,), 2.0))
    assert st["std"] == 0.0 and st["skew"] is None and st["kurtosis"] is None and st["kl_gauss"] is None


def test_strided_sample_covers_every_column():
    flat = torch.arange(64 * 1000)
    view = S.strided(flat, 1000, cols=64)
    assert view.numel() <= 1000 and len(set((view % 64).tolist())) == 64


def test_sampled_moments_keep_counts_and_extremes_exact():
    x = torch.zeros(200_000)
    x[1::2] = torch.linspace(-5, 5, 100_000)
    st = _finalized(x, sample=1000)
    assert st["zero_frac"] == 0.5  # every even element; linspace of an even count skips 0
    assert (st["min"], st["max"]) == (-5.0, 5.0)


def test_heavy_tails_get_exact_moments_and_light_ones_say_they_were_sampled(torch_path):
    g = torch.Generator().manual_seed(5)
    n = 2_000_000
    normal = torch.randn(n, generator=g)
    chi2 = torch.randn(3, n, generator=g).pow(2).sum(0)
    t3 = normal / (chi2 / 3).sqrt()  # Student-t, 3 degrees of freedom: infinite 4th moment
    st = _finalized(t3, sample=S.DEFAULT_SAMPLE)
    ref = t3.double().numpy()
    assert st["sampled"] is False
    assert st["kurtosis"] == pytest.approx(sps.kurtosis(ref), rel=1e-6)
    assert st["skew"] == pytest.approx(sps.skew(ref), rel=1e-6, abs=1e-9)
    assert st["std"] == pytest.approx(ref.std(), rel=1e-9)
    light = _finalized(normal, sample=S.DEFAULT_SAMPLE)
    assert light["sampled"] is True and light["kurtosis"] == pytest.approx(0.0, abs=0.1)
    assert _finalized(normal)["sampled"] is False


def _vectors_agree(t: torch.Tensor, sat: tuple[float, float] | None = None) -> None:
    one_pass = S.moments(t, sat)
    assert isinstance(one_pass, list) and one_pass[S.SAMPLED] == 0
    flat = t.detach().reshape(-1)
    reference = S._masked_moments(flat if flat.is_floating_point() else flat.double(), flat.numel(), sat).tolist()
    assert one_pass == pytest.approx(reference, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_one_pass_helper_equals_the_exact_pytorch_path(dtype):
    """The C helper reads every element once: its vector equals the exact PyTorch reduction, NaN/Inf,
    zeros, a far-off mean and one huge outlier included (it redoes the pass around the mean then)."""
    g = torch.Generator().manual_seed(7)
    special = torch.randn(3001, generator=g)
    special[::97], special[5], special[6] = float("nan"), float("inf"), -float("inf")
    cases = [torch.randn(4096, generator=g) * 2 + 0.5, torch.relu(torch.randn(300, 70, generator=g)), special,
             torch.randn(5000, generator=g) * 1e-3 + 1000.0, torch.cat([torch.randn(9999, generator=g), torch.tensor([1e7])]),
             torch.full((17,), 3.0), torch.tanh(torch.randn(2000, generator=g) * 3)]
    assert fused.unavailable() is None  # a C compiler is there: the helper is built and used
    for t in cases:
        _vectors_agree(t.to(dtype))
    _vectors_agree(torch.tanh(torch.randn(2000, generator=g) * 3).to(dtype), S.SATURATING["Tanh"])
    assert S.moments(torch.randn(10, 20, generator=g).t())[S.SAMPLED] == 0  # not contiguous: the PyTorch path
