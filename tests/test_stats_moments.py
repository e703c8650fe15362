"""Pure logic of modulelens.stats.stats: moment vectors, exact merging, sampling, finalizing."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats as sps

from modulelens.stats import stats as S


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


def test_heavy_tails_get_exact_moments_and_light_ones_say_they_were_sampled():
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
