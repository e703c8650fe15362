"""Unit tests of the pieces module validation runs on inside the sandbox worker (the end-to-end
validation of a module candidate is in tests/test_pack_tinyformer.py)."""

from __future__ import annotations

import time

import torch

from modulelens.kernels import module_validate


def test_isolation_of_module_candidates_claims_only_the_worker():
    iso = module_validate.worker_isolation()
    layers = {x.name: x.in_force for x in iso.layers}
    assert layers["sandbox worker"] and layers["rlimits"]
    for absent in ("process separation", "namespaces", "private /tmp", "landlock", "seccomp"):
        assert layers[absent] is False, absent
    assert "not in force: process separation" in iso.summary()


def test_counter_counts_computing_aten_ops_not_copies_or_views():
    x = torch.randn(4, 3)
    with module_validate._AtenCallCounter() as counter:
        (x.t().contiguous().clone() * 2).sum()
    assert set(counter.calls) == {"aten.mul.Tensor", "aten.sum.default"}, counter.calls


def test_a_replaced_timer_is_noticed(monkeypatch):
    assert module_validate.changed_timers() == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert module_validate.changed_timers() == ["time.perf_counter"]
