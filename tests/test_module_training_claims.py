"""Module candidates that claim training, on KernelBench-style problems with a training-mode
BatchNorm (a Linear with bias, a convolution with bias, a Linear without bias, each in front of
one), validated with ``claims_training``.

What each verdict rests on: a training call's buffers (running statistics, ``num_batches_tracked``)
are outputs of it, compared after every training call, so a candidate that skips the update or
updates copies is rejected naming the buffer; a bias gradient that is mathematically zero (the
BatchNorm removes any per-column shift) is rounding noise on both sides, judged against the
float64 oracle with an absolute floor rather than relative to the noise, while a wrong one is
still rejected; after timing in training mode, the eval recheck compares two modules of the same
state; and a rejected candidate whose outputs were compared ran.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import modulelens
from modulelens.registry import ToolContext
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel

pytestmark = pytest.mark.slow

PROBLEMS = {
    "linear_bias_bn": """
        class Model(nn.Module):
            def __init__(self, in_features, out_features, bias):
                super().__init__()
                self.gemm = nn.Linear(in_features, out_features, bias=bias)
                self.bn = nn.BatchNorm1d(out_features)

            def forward(self, x):
                return torch.relu(self.bn(self.gemm(x)))

        def get_inputs():
            return [torch.randn(128, 512)]

        def get_init_inputs():
            return [512, 192, True]
    """,
    "conv_bias_bn": """
        class Model(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
                self.bn = nn.BatchNorm2d(out_channels)

            def forward(self, x):
                return self.bn(self.conv(x))

        def get_inputs():
            return [torch.randn(8, 3, 16, 16)]

        def get_init_inputs():
            return [3, 16, 3]
    """,
}
PROBLEMS["linear_bn"] = PROBLEMS["linear_bias_bn"].replace("[512, 192, True]", "[512, 192, False]")
HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

# A BatchNorm written out in torch operators (its own rounding, so its gradients' noise differs from
# eager's), the running statistics updated like nn.BatchNorm's; or, per candidate, not quite.
MANUAL_BN = """
def batch_norm(bn, y):
    dims = [0, *range(2, y.dim())]
    shape = [1, -1] + [1] * (y.dim() - 2)
    if bn.training:
        mean = y.mean(dims)
        var = ((y - mean.view(shape)) ** 2).mean(dims)
        with torch.no_grad():
            n = y.numel() // y.shape[1]
            UPDATE
    else:
        mean, var = bn.running_mean, bn.running_var
    return (y - mean.view(shape)) / torch.sqrt(var.view(shape) + bn.eps) * bn.weight.view(shape) + bn.bias.view(shape)


def copied_statistics(bn, y):  # the batch's statistics used, the running ones updated on copies thrown away
    return F.batch_norm(y, bn.running_mean.clone(), bn.running_var.clone(), bn.weight, bn.bias, bn.training,
                        bn.momentum, bn.eps)
"""
MEAN = "bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)"
VAR = "bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var * n / (n - 1))"
UPDATES = {"custom": [MEAN, VAR, "bn.num_batches_tracked += 1"], "skips the update": ["pass"],
           "no counter": [MEAN, VAR]}
MODEL_NEW = {
    "linear": """
class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=bias)
        self.bn = nn.BatchNorm1d(out_features)

    def forward(self, x):
        y = x @ self.gemm.weight.t()
        if self.gemm.bias is not None:
            y = y + BIAS
        return torch.relu(NORM(self.bn, y))
""",
    "conv": """
class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        return NORM(self.bn, F.conv2d(x, self.conv.weight, BIAS))
""",
}
# the bias passed through an identity whose backward adds 0.01: its gradient is no longer the noise around zero
WRONG_BIAS_GRADIENT = """
class ShiftedGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, b):
        return b.clone()

    @staticmethod
    def backward(ctx, g):
        return g + 0.01
"""


def _problem_source(name: str) -> str:
    return HEADER + textwrap.dedent(PROBLEMS[name])


def _original(name: str) -> str:
    """The original module's own operators as a ModelNew."""
    return _problem_source(name).split("def get_inputs")[0].replace("class Model(", "class ModelNew(")


def _manual(name: str, update: str = "custom", norm: str = "batch_norm", bias: str = "", extra: str = "") -> str:
    """A ModelNew for problem ``name`` normalising with ``norm`` (``batch_norm``, its running statistics
    updated as ``update`` says, or ``copied_statistics``); ``bias``: what it adds as the bias."""
    kind = "conv" if name.startswith("conv") else "linear"
    bias = bias or ("self.conv.bias" if kind == "conv" else "self.gemm.bias")
    helpers = MANUAL_BN.replace("UPDATE", "\n            ".join(UPDATES[update]))
    return HEADER + extra + helpers + MODEL_NEW[kind].replace("NORM", norm).replace("BIAS", bias)


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """Each problem file captured once as a KernelBench file (in training mode, as built)."""
    repo = tmp_path_factory.mktemp("training-claims")
    refs = {}
    for name in PROBLEMS:
        path = repo.parent / f"{repo.name}-{name}.py"
        path.write_text(_problem_source(name))
        refs[name] = modulelens.capture_module(str(path), name=name, repo=str(repo)).ref
    return repo, refs


def _validate(problems, name: str, source: str, claims_training: bool = True, time: bool = False):
    repo, refs = problems
    req = ValidateKernelRequest(source_text=source, target=refs[name], seeds=1, time=time,
                                claims_training=claims_training, limit=100)
    return validate_kernel(req, ToolContext(repo_root=Path(repo)))


def _failed(r) -> list:
    return [c for c in r.checks if not c.passed]


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_the_original_operators_are_accepted_in_training(problems, name):
    r = _validate(problems, name, _original(name))
    assert r.correct and r.verdict == "wrapper", r.reason
    assert "training mode checked" in r.timing_note, r.timing_note
    buffers = [c for c in r.checks if c.name.startswith("buffers after training call")]
    assert buffers and all("bn.running_mean" in c.detail and "bn.num_batches_tracked" in c.detail
                           for c in buffers), buffers
    assert any(c.name.startswith("output 0 values (eval after ") for c in r.checks)


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_a_correct_custom_batch_norm_is_accepted_with_its_gradients_judged_fairly(problems, name):
    r = _validate(problems, name, _manual(name))
    assert r.correct, (r.reason, _failed(r))
    if name != "linear_bn":  # the bias gradient is mathematically zero: rounding noise on both sides
        bias = "gemm.bias" if name == "linear_bias_bn" else "conv.bias"
        floored = [a for a in r.accuracy if a.case.endswith(f": {bias}") and a.absolute_floor is not None]
        assert floored and all(a.accepted for a in floored), r.accuracy
        a = floored[0]
        assert a.candidate_max_abs is not None and a.eager_max_abs is not None, a  # both errors reported
        assert a.eager_max_abs < a.absolute_floor, a


def test_a_wrong_gradient_at_noise_scale_is_still_rejected(problems):
    source = _manual("linear_bias_bn", bias="ShiftedGradient.apply(self.gemm.bias)", extra=WRONG_BIAS_GRADIENT)
    r = _validate(problems, "linear_bias_bn", source)
    assert not r.correct and r.verdict == "rejected", r.reason
    assert "gemm.bias" in r.reason and "at rounding-noise scale" in r.reason and "still rejected" in r.reason, r.reason
    assert any(a.absolute_floor is not None and not a.accepted for a in r.accuracy), r.accuracy


@pytest.mark.parametrize("name, update, norm, buffer", [
    ("linear_bias_bn", "skips the update", "batch_norm", "bn.running_mean"),
    ("conv_bias_bn", "custom", "copied_statistics", "bn.running_mean"),
    ("linear_bn", "custom", "copied_statistics", "bn.running_mean"),
    ("linear_bn", "no counter", "batch_norm", "bn.num_batches_tracked"),
])
def test_a_candidate_that_skips_or_copies_the_running_statistics_update_is_rejected_naming_the_buffer(
        problems, name, update, norm, buffer):
    r = _validate(problems, name, _manual(name, update, norm))
    assert not r.correct and r.verdict == "rejected", r.reason
    assert r.reason.startswith(f"{buffer} differs after training call 1 (training, same RNG state, captured inputs)"), \
        r.reason
    assert r.ran and not any("compiled only" in w for w in r.warnings), (r.ran, r.warnings)  # its outputs were compared


def test_eval_only_validation_is_unchanged(problems):
    r = _validate(problems, "linear_bias_bn", _manual("linear_bias_bn", "skips the update"), claims_training=False)
    assert r.correct, (r.reason, _failed(r))
    assert "checked in eval mode only" in r.timing_note, r.timing_note
    assert not any("training" in c.name for c in r.checks), [c.name for c in r.checks]


def test_timing_in_training_mode_leaves_the_recheck_comparing_the_same_state(problems):
    r = _validate(problems, "linear_bn", _original("linear_bn"), time=True)
    assert r.correct and r.verdict == "wrapper", (r.reason, _failed(r))
    assert r.timing_status in ("ok", "undetermined"), r.timing_status
    assert any(c.name.startswith("output 0 values (fresh values in the timed buffers after timing)") and c.passed
               for c in r.checks), r.checks
