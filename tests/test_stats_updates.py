"""Pure logic of modulelens.stats.updates: update samples and the update-to-weight ratio."""

from __future__ import annotations

import pytest
import torch

from modulelens.stats.updates import UPDATE_SAMPLE, UpdateMeasurement, scalars_to_host, update_sample


def test_update_sample_is_a_view_of_whole_rows_for_large_weights():
    w = torch.randn(4096, 64)
    s = update_sample(w)
    assert s.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    assert s.shape[1] == 64 and s.numel() <= UPDATE_SAMPLE
    small = torch.randn(10, 10)
    assert torch.equal(update_sample(small), small.reshape(-1))


def test_update_measurement_gives_the_exact_ratio():
    p = torch.nn.Parameter(torch.randn(50, 20, dtype=torch.float64))
    p.grad = torch.full_like(p, 0.5)
    before = p.detach().clone()
    m = UpdateMeasurement()
    m.before_step([("w", p)], {})
    with torch.no_grad():
        p.sub_(0.1 * p.grad)
    m.after_step([p])
    numel, wn, gn, dead = m.norms["w"]
    dn, bn = scalars_to_host(list(m.updates["w"]))
    assert numel == 1000 and float(wn) == pytest.approx(before.norm().item())
    assert float(gn) == pytest.approx(p.grad.norm().item()) and float(dead) == 0.0
    assert dn / bn == pytest.approx((p.detach() - before).norm().item() / before.norm().item(), rel=1e-12)
    assert not m.before  # measured once


def test_scalars_to_host_mixes_floats_and_tensors():
    assert scalars_to_host([1.5, torch.tensor(2.0), torch.tensor([3.0])]) == [1.5, 2.0, 3.0]
