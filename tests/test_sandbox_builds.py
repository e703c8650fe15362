"""Processes, builds and limits across validations: candidates are forked whatever thread settings the
caller has; a module candidate's own C++ extension (built with
``load_inline``) is built once and then taken from the checksummed shared build cache, like a card
candidate's; and the memory limit a validation asks for reaches the sandbox pool's worker."""

from __future__ import annotations

import uuid

import pytest

from conftest import capture_tanh_scale

from modulelens.registry import ToolContext
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel
from modulelens.validation.sandboxed import pool

pytestmark = pytest.mark.slow


MODEL_NEW = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = """
// SESSION
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/Exceptions.h>
#include <cmath>
at::Tensor scaled_tanh(at::Tensor x, at::Tensor w) {
    auto xc = x.contiguous();
    auto y = at::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    const float* s = w.data_ptr<float>();
    float* o = y.data_ptr<float>();
    int64_t n = w.numel(), total = xc.numel();
    for (int64_t i = 0; i < total; ++i) o[i] = std::tanh(a[i]) * s[i % n];
    return y;
}
"""
ext = load_inline(name="ml_test_scaled_tanh", cpp_sources=[SOURCE], functions=["scaled_tanh"],
                  no_implicit_headers=True, verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return ext.scaled_tanh(x, self.weight.detach().contiguous())
'''


def test_a_module_candidates_extension_is_built_once_then_shared(tmp_path):
    repo = tmp_path / "repo"
    capture_tanh_scale(repo, "st")
    source = MODEL_NEW.replace("SESSION", uuid.uuid4().hex)  # new to this session: built the first time
    req = ValidateKernelRequest(source_text=source, target="st", seeds=1, time=False)
    first = validate_kernel(req, ToolContext(repo_root=repo))
    assert first.verdict == "custom" and first.correct, first.reason
    built = next(c for c in first.checks if c.name == "extension ml_test_scaled_tanh")
    assert built.detail.startswith("built, verified and shared as ml_mod_"), built.detail
    again = validate_kernel(req.model_copy(update={"source_text": None, "target": None,
                                                   "candidate": first.candidate_id}), ToolContext(repo_root=repo))
    assert again.verdict == "custom", again.reason
    shared = next(c for c in again.checks if c.name == "extension ml_test_scaled_tanh")
    assert shared.detail == "taken from the shared build cache", shared.detail


def test_the_memory_limit_a_validation_asks_for_reaches_the_pool(softmax_card):
    repo, card_id = softmax_card
    legit = "import torch\n\ndef forward(x, dim, half_to_float):\n    return torch.softmax(x, dim)\n"
    r = validate_kernel(ValidateKernelRequest(source_text=legit, target=card_id, backend="triton", time=False,
                                              memory_limit_mb=3000), ToolContext(repo_root=repo))
    assert r.verdict == "wrapper", r.reason
    assert pool()._worker is not None and pool()._worker.memory_limit_mb == 3000


def test_candidates_are_forked_even_where_no_thread_count_is_set(softmax_card, monkeypatch):
    """Without OMP_NUM_THREADS (a user's default), loading numpy's OpenBLAS starts a thread pool: a
    worker must still be a template with one thread, and a used worker is never reused after
    answering in-process."""
    import modulelens.sandbox.pool as pools

    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pools, "_POOLS", {})  # a worker started now, with this environment
    repo, card_id = softmax_card
    legit = "import torch\n\ndef forward(x, dim, half_to_float):\n    return torch.softmax(x, dim)\n"
    try:
        for _ in range(2):
            r = validate_kernel(ValidateKernelRequest(source_text=legit, target=card_id, backend="triton", time=False),
                                ToolContext(repo_root=repo))
            assert r.verdict == "wrapper", r.reason
            assert "fork server" in r.isolation.in_force(), r.isolation.summary()
    finally:
        for found in pools._POOLS.values():
            found.close()
