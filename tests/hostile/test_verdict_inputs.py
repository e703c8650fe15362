"""Hostile candidates against the verdict's inputs (issue 24, item 5): each file in this folder is a
candidate written to be called custom, or accepted, by lying about itself inside its own process.
The verdict must not rest on what it can replace: custom or wrapper is decided by a run where the
reference library is denied before its code loads, aliasing by the checker from the arena."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import validate_source

from modulelens.registry import ToolContext
from modulelens.sandbox.containment import landlock_abi, namespace_prefix
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
CONTAINED = bool(namespace_prefix()[0]) and landlock_abi() >= 1


def _module(repo: Path, candidate: str, target: str):
    return validate_source(repo, (HERE / candidate).read_text(), target)


def test_a_candidate_replacing_the_op_tracer_is_a_wrapper(scale_repo):
    r = _module(scale_repo, "tracer_replacing_module.py", "scale")
    assert r.correct and r.verdict == "wrapper", r.reason
    assert not r.backend_calls  # the trace it replaced shows nothing: the denial run decided
    assert r.denial is not None and r.denial.outcome == "fails" and "aten::tanh" in r.denial.detail, r.denial


def test_a_softmax_computed_in_numpy_through_ctypes_is_a_wrapper(softmax_card):
    repo, card_id = softmax_card
    req = ValidateKernelRequest(source_text=(HERE / "ctypes_numpy_softmax.py").read_text(), target=card_id,
                                backend="triton", time=False, seeds=1)
    r = validate_kernel(req, ToolContext(repo_root=repo))
    assert r.correct and r.verdict == "wrapper", r.reason
    assert r.denial is not None and r.denial.outcome == "fails" and "numpy" in r.denial.detail, r.denial
    assert r.varied == ["self"]  # the card's floating tensor arguments, by their schema names


@pytest.mark.skipif(not CONTAINED, reason="the memory denial of numpy needs Landlock (files) and namespaces")
def test_a_candidate_undoing_the_denial_cannot_and_is_a_wrapper(scale_repo):
    r = _module(scale_repo, "numpy_undoing_the_denial.py", "scale")
    assert r.correct and r.verdict == "wrapper", r.reason
    assert r.denial is not None and r.denial.outcome == "fails", r.denial
    assert "SIG" in r.denial.detail, r.denial  # numpy's code stayed unusable: calling it killed the process
    assert "inaccessible" in r.denial.denied and "seccomp" in r.denial.denied, r.denial.denied


def test_an_output_aliasing_its_input_through_a_second_mapping_is_rejected(scale_repo):
    r = _module(scale_repo, "alias_second_mapping.py", "copy")
    assert r.verdict == "rejected" and "shares memory with the inputs" in r.reason, r.reason
    assert "checker rewrote" in r.reason


def test_an_honest_copy_of_the_same_module_is_custom(scale_repo):
    honest = ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
              "        out = torch.empty_like(x)\n        out.copy_(x)\n        return out\n")
    req = ValidateKernelRequest(source_text=honest, target="copy", seeds=1, time=False)
    r = validate_kernel(req, ToolContext(repo_root=scale_repo))
    assert r.verdict == "custom" and r.correct, r.reason
