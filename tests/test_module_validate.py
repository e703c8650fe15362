"""Module-level candidates (KernelBench ModelNew) run in their own contained candidate process:
hostile ones are caught there, and the report's isolation says what was in force. The pieces the
checker uses are unit-tested at the end (the end-to-end validation of a C++ module candidate with
training claims is in tests/test_pack_tinyformer.py)."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import validate_source

import modulelens
from modulelens.validation.module import readable_sys_path
from modulelens.registry import ToolContext
from modulelens.sandbox.containment import landlock_abi, namespace_prefix
from modulelens.tools.validate_kernel import ValidateKernelRequest as ValidateModuleRequest
from modulelens.tools.validate_kernel import validate_kernel as validate_module

pytestmark = pytest.mark.slow
CONTAINED = bool(namespace_prefix()[0]) and landlock_abi() >= 1


def _validate(repo: Path, body: str, **kw):
    return validate_source(repo, "import torch\nimport torch.nn as nn\n\n" + textwrap.dedent(body), **kw)


MODEL = """
class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
{body}
"""


def _model(body: str) -> str:
    return MODEL.format(body=textwrap.indent(textwrap.dedent(body), " " * 8))


def _stored_settings(repo: Path, report: str):
    from modulelens.repo import Repository
    from modulelens.validation.stored_reports import REPORTS, ReportManifest

    return Repository(repo).open(REPORTS, report).manifest_as(ReportManifest).settings


def test_a_torch_module_candidate_runs_contained_and_is_a_wrapper(scale_repo):
    r = _validate(scale_repo, _model("return torch.tanh(x) * self.weight"), time=True, device="cpu")
    assert r.correct and r.verdict == "wrapper", r.reason
    assert any("tanh" in c for c in r.backend_calls), r.backend_calls
    assert r.timing_status in ("ok", "undetermined") and "checker" in r.candidate.timer
    assert r.speedup_interval or "range of round ratios" in r.timing_reason, r.timing_reason
    assert "module forward on cpu (the captured device), in eval mode" in r.timing_note, r.timing_note
    assert "thread(s)" in r.timing_note
    assert r.eager.device == r.candidate.device == "cpu"  # the reference and the candidate process
    assert _stored_settings(scale_repo, r.report).device == "cpu"
    layers = {x.name: x for x in r.isolation.layers}
    assert layers["process separation"].in_force
    if CONTAINED:
        assert layers["namespaces"].in_force and layers["landlock"].in_force
        assert layers["signing key and repository unreadable"].in_force, layers["signing key and repository unreadable"]
    else:
        assert not layers["signing key and repository unreadable"].in_force


def test_a_numpy_module_candidate_is_a_wrapper_naming_numpy(scale_repo):
    r = _validate(scale_repo, _model("""
        import numpy as np
        return torch.from_numpy(np.tanh(x.numpy())) * self.weight
        """))
    assert r.correct and r.verdict == "wrapper", r.reason
    assert "numpy" in r.reason, r.reason
    assert r.timing_note.startswith("ran on cpu (the captured device); checked in eval mode only"), r.timing_note
    assert _stored_settings(scale_repo, r.report).device is None  # none asked for: the captured one


class DropGate(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x):
        return nn.functional.dropout(torch.tanh(x), 0.25, self.training) * self.weight


DROP_GATE = _model("return nn.functional.dropout(torch.tanh(x), 0.25, self.training) * self.weight")


def _capture_drop_gate(repo: Path, monkeypatch=None, device: str | None = None) -> None:
    """``gate``: a DropGate captured in training with its gradients; ``device``: what the capture
    says it was made on (its tensors stay on the CPU; a real CUDA capture cannot be made here)."""
    artifact = importlib.import_module("modulelens.capture.artifact")  # modulelens.capture is a function too
    if device is not None:
        recorded = artifact._environment
        monkeypatch.setattr(artifact, "_environment",
                            lambda captured: recorded(captured).model_copy(update={"device": device}))
    torch.manual_seed(0)
    with modulelens.capture("1", name="gate", repo=repo, backward=True, export=False):
        nn.Sequential(nn.Linear(8, 8), DropGate(8)).train()(torch.randn(4, 8)).sum().backward()


def test_device_cpu_moves_a_cuda_capture_to_the_cpu(tmp_path, monkeypatch):
    """Without a device, a capture made on CUDA is refused here (the one device error); with
    ``device="cpu"`` it is validated on the CPU, in training too: the captured output, RNG state and
    gradients (another device's draws) give way to the original module run on the CPU."""
    from modulelens.device import DeviceUnavailable

    _capture_drop_gate(tmp_path, monkeypatch, device="cuda:0")
    with pytest.raises(DeviceUnavailable) as e:
        _validate_gate(tmp_path)
    assert "device 'cuda:0' was asked for" in e.value.message and "[--device cpu]" in e.value.hint
    r = _validate_gate(tmp_path, device="cpu")
    assert r.correct, r.reason
    checks = {c.name: c for c in r.checks}
    assert checks["training, captured RNG state, against the captured output"].detail.startswith(
        "skipped: captured on cuda:0"), r.checks
    assert "output 0 values (gradients, against the original module (captured on cuda:0): weight)" in checks
    assert r.timing_note.startswith("ran on cpu (captured on cuda:0); training mode checked"), r.timing_note
    assert _stored_settings(tmp_path, r.report).device == "cpu"


def _validate_gate(repo: Path, **kw):
    req = ValidateModuleRequest(source_text="import torch\nimport torch.nn as nn\n" + DROP_GATE, target="gate",
                                seeds=1, time=False, claims_training=True, limit=100, **kw)
    return validate_module(req, ToolContext(repo_root=repo))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_cuda_validates_a_cpu_capture_on_the_gpu(scale_repo, tmp_path):
    r = _validate(scale_repo, _model("return torch.tanh(x) * self.weight"), time=True, device="cuda")
    assert r.correct, r.reason
    assert "module forward on cuda (captured on cpu), in eval mode" in r.timing_note, r.timing_note
    assert r.eager.device == r.candidate.device == "cuda"
    assert _stored_settings(scale_repo, r.report).device == "cuda"
    _capture_drop_gate(tmp_path)  # dropout in training: the same RNG state on the GPU on both sides
    r = _validate_gate(tmp_path, device="cuda")
    assert r.correct, r.reason
    assert r.timing_note.startswith("ran on cuda (captured on cpu)"), r.timing_note


@pytest.mark.skipif(not CONTAINED, reason="needs namespaces and Landlock")
def test_a_module_candidate_cannot_read_the_signing_key(scale_repo):
    from modulelens.repo.trust import config_dir, machine_key

    machine_key()  # make sure the key exists
    key = config_dir() / "key"
    assert key.exists()
    r = _validate(scale_repo, _model(f"""
        open({str(key)!r}, "rb").read()
        return torch.tanh(x) * self.weight
        """))
    assert r.verdict == "rejected" and ("PermissionError" in r.reason or "FileNotFoundError" in r.reason), r.reason


@pytest.mark.skipif(not CONTAINED, reason="needs namespaces and Landlock")
def test_a_module_candidate_cannot_write_outside_its_scratch(scale_repo, tmp_path):
    marker = Path.home() / "modulelens-module-escape.txt"
    outside = tmp_path / "escape.txt"
    r = _validate(scale_repo, _model(f"""
        for path in ({str(marker)!r}, {str(outside)!r}):
            try:
                open(path, "w").write("escaped")
            except OSError:
                pass
        return torch.tanh(x) * self.weight
        """))
    assert r.correct, r.reason
    assert not marker.exists() and not outside.exists()


@pytest.mark.skipif(not CONTAINED, reason="needs namespaces and Landlock")
def test_a_module_candidate_cannot_read_the_expected_output(scale_repo):
    outputs = next(scale_repo.rglob("outputs.safetensors"))
    r = _validate(scale_repo, _model(f"""
        from safetensors.torch import load_file
        return next(iter(load_file({str(outputs)!r}).values())).clone()
        """))
    assert r.verdict == "rejected", r.reason
    assert "PermissionError" in r.reason or "FileNotFoundError" in r.reason, r.reason


def test_module_candidate_that_does_not_build_is_rejected_for_it(scale_repo):
    r = _validate(scale_repo, """
        class ModelNew(nn.Module):
            def __init__(self, width):
                super().__init__()
        """)
    assert r.verdict == "rejected" and "cannot be built" in r.reason, r.reason


# -- unit tests of what the checker uses ---------------------------------------------------------

def test_sys_path_folders_holding_the_repository_or_key_are_not_readable(tmp_path, monkeypatch):
    monkeypatch.setenv("MODULELENS_CONFIG_DIR", str(tmp_path / "cfg"))
    project, code, elsewhere = tmp_path / "project", tmp_path / "project" / "src", tmp_path / "lib"
    for p in (code, elsewhere, tmp_path / "cfg"):
        p.mkdir(parents=True)
    allowed = readable_sys_path([str(project), str(code), str(elsewhere), str(tmp_path / "cfg"),
                                                 str(tmp_path / "missing"), ""], project / ".modulelens")
    assert allowed == [code.resolve(), elsewhere.resolve()]
