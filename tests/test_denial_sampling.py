"""The denial's CPU-time sampler (issue 33, item 1), in this process: the kernel's samples of
where time goes are attributed to torch's compute code for a kernel (gelu, a matmul) and not for
what honest candidates run in torch (allocation, copies, fills, views); a sampler that saw far less
CPU time than the process used is named, not trusted."""

from __future__ import annotations

import os

import pytest
import torch

from modulelens.validation.sampling import Samples, TaskSampler, attribute, coverage_problem, open_task_sampler


@pytest.fixture(scope="module")
def sampler():
    fds = open_task_sampler()
    if not fds:
        pytest.skip("the kernel offers no perf sampling events here")
    s = TaskSampler(fds, os.getpid())
    yield s
    s.close()
    for fd in fds:
        os.close(fd)


def _watch(sampler: TaskSampler, fn, cpu_s: float = 0.08):
    sampler.start()
    t = os.times()
    while os.times().user - t.user < cpu_s:
        fn()
    got = sampler.stop()
    with open("/proc/self/maps") as f:
        return got, attribute(got.ips, f.read())


X = torch.randn(128, 512)
W = torch.randn(512, 128)


@pytest.mark.parametrize(("name", "fn", "kernel"), [
    ("gelu", lambda: torch.nn.functional.gelu(X), "gelu"),
    ("matmul", lambda: X @ W, "gemm"),
])
def test_time_in_a_torch_kernel_is_compute_and_named(sampler, name, fn, kernel, monkeypatch):
    # Restored after the test: a process-wide switch left off changes later tests' kernels.
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    got, seen = _watch(sampler, fn)
    assert coverage_problem(got) is None
    assert seen.compute_share() > 0.5, seen.places[:5]
    assert "libtorch_cpu.so" in seen.route() and kernel in seen.route().lower(), seen.route()


@pytest.mark.parametrize(("name", "fn"), [
    ("clone", lambda: X.clone()),
    ("empty_like and copy_", lambda: torch.empty_like(X).copy_(X)),
    ("zeros", lambda: torch.zeros(128, 512)),
    ("conversion", lambda: X.to(torch.float64)),
    ("views of a small tensor", lambda: X[:4].reshape(2, 2, 512).transpose(0, 1).contiguous()),
    ("random fill", lambda: torch.empty(128, 512).normal_()),
])
def test_what_honest_candidates_run_in_torch_is_not_compute(sampler, name, fn):
    got, seen = _watch(sampler, fn)
    assert seen.total > 100
    assert seen.compute_share() < 0.005, [p for p in seen.places if p.compute][:5]


def test_a_sampler_that_saw_far_less_cpu_time_than_the_process_used_is_named():
    off = Samples(ips=[1] * 10, pids=[1] * 10, sampled_ns=5_000_000, cpu_ns=400_000_000)
    assert "counted 5 ms of the 400 ms" in coverage_problem(off)
    silent = Samples(ips=[1] * 10, pids=[1] * 10, sampled_ns=400_000_000, cpu_ns=400_000_000)
    assert "wrote 10 samples" in coverage_problem(silent)
    lossy = Samples(ips=[1] * 3000, pids=[1] * 3000, lost=5000, sampled_ns=400_000_000, cpu_ns=400_000_000)
    assert "5000 of 8000 samples were lost" in coverage_problem(lossy)
    fine = Samples(ips=[1] * 8000, pids=[1] * 8000, sampled_ns=400_000_000, cpu_ns=400_000_000)
    assert coverage_problem(fine) is None
    full = Samples(ips=[1] * 10, pids=[1] * 10, sampled_ns=400_000_000, cpu_ns=400_000_000, overflowed=True)
    assert coverage_problem(full) is None  # a full ring drops later samples: not tampering


def test_a_window_longer_than_the_ring_is_seen_to_overflow(sampler):
    from modulelens.validation.sampling import PERIOD_NS

    got, seen = _watch(sampler, lambda: X.clone(), cpu_s=1.5 * sampler.capacity() * PERIOD_NS / 1e9)
    assert got.overflowed and coverage_problem(got) is None
    got, _ = _watch(sampler, lambda: X.clone(), cpu_s=0.02)
    assert not got.overflowed
