"""Module-level candidates (KernelBench ModelNew) run in their own contained candidate process:
hostile ones are caught there, and the report's isolation says what was in force. The pieces the
checker uses are unit-tested at the end (the end-to-end validation of a C++ module candidate with
training claims is in tests/test_pack_tinyformer.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import modulelens
from modulelens.validation.module import readable_sys_path
from modulelens.registry import ToolContext
from modulelens.sandbox.containment import landlock_abi, namespace_prefix
from modulelens.tools.validate_kernel import ValidateKernelRequest as ValidateModuleRequest
from modulelens.tools.validate_kernel import validate_kernel as validate_module

pytestmark = pytest.mark.slow
CONTAINED = bool(namespace_prefix()[0]) and landlock_abi() >= 1


class Scale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x):
        return torch.tanh(x) * self.weight


@pytest.fixture(scope="module")
def scale_capture(tmp_path_factory):
    repo = tmp_path_factory.mktemp("module-repo")
    with modulelens.capture("", name="scale", repo=repo, export=False):
        Scale(16)(torch.randn(8, 16))
    return repo


def _validate(repo: Path, body: str, **kw):
    source = "import torch\nimport torch.nn as nn\n\n" + textwrap.dedent(body)
    req = ValidateModuleRequest(source_text=source, target="scale", seeds=1, **{"time": False, **kw})
    return validate_module(req, ToolContext(repo_root=repo))


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


def test_a_torch_module_candidate_runs_contained_and_is_a_wrapper(scale_capture):
    r = _validate(scale_capture, _model("return torch.tanh(x) * self.weight"), time=True)
    assert r.correct and r.verdict == "wrapper", r.reason
    assert any("tanh" in c for c in r.backend_calls), r.backend_calls
    assert r.timing_status in ("ok", "undetermined") and r.speedup_interval and "checker" in r.candidate.timer
    assert "module forward in eval mode" in r.timing_note and "thread(s)" in r.timing_note
    layers = {x.name: x for x in r.isolation.layers}
    assert layers["process separation"].in_force
    if CONTAINED:
        assert layers["namespaces"].in_force and layers["landlock"].in_force
        assert layers["signing key and repository unreadable"].in_force, layers["signing key and repository unreadable"]
    else:
        assert not layers["signing key and repository unreadable"].in_force


def test_a_numpy_module_candidate_is_a_wrapper_naming_numpy(scale_capture):
    r = _validate(scale_capture, _model("""
        import numpy as np
        return torch.from_numpy(np.tanh(x.numpy())) * self.weight
        """))
    assert r.correct and r.verdict == "wrapper", r.reason
    assert "numpy" in r.reason, r.reason


@pytest.mark.skipif(not CONTAINED, reason="needs namespaces and Landlock")
def test_a_module_candidate_cannot_read_the_signing_key(scale_capture):
    from modulelens.repo.trust import config_dir, machine_key

    machine_key()  # make sure the key exists
    key = config_dir() / "key"
    assert key.exists()
    r = _validate(scale_capture, _model(f"""
        open({str(key)!r}, "rb").read()
        return torch.tanh(x) * self.weight
        """))
    assert r.verdict == "rejected" and ("PermissionError" in r.reason or "FileNotFoundError" in r.reason), r.reason


@pytest.mark.skipif(not CONTAINED, reason="needs namespaces and Landlock")
def test_a_module_candidate_cannot_write_outside_its_scratch(scale_capture, tmp_path):
    marker = Path.home() / "modulelens-module-escape.txt"
    outside = tmp_path / "escape.txt"
    r = _validate(scale_capture, _model(f"""
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
def test_a_module_candidate_cannot_read_the_expected_output(scale_capture):
    outputs = next(scale_capture.rglob("outputs.safetensors"))
    r = _validate(scale_capture, _model(f"""
        from safetensors.torch import load_file
        return next(iter(load_file({str(outputs)!r}).values())).clone()
        """))
    assert r.verdict == "rejected", r.reason
    assert "PermissionError" in r.reason or "FileNotFoundError" in r.reason, r.reason


def test_module_candidate_that_does_not_build_is_rejected_for_it(scale_capture):
    r = _validate(scale_capture, """
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
