"""The README's default layout is as safe as a custom one (issue 33, item 4): the repository at
``./.modulelens`` inside the project folder, the project on the import path (``PYTHONPATH``, an
editable install), and the build folder under /tmp. A candidate finds nothing of the repository
(masked in its mount namespace) nor of the host's /tmp (its private /tmp binds in only the folders
it needs), and the validation reports every layer in force."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import pytest
import torch

import modulelens
from modulelens.registry import ToolContext
from modulelens.sandbox.containment import landlock_abi, namespace_prefix
from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops
from modulelens.tools.validate_kernel import ValidateKernelRequest, validate_kernel
from tests.conftest import full_report

HERE = Path(__file__).parent
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (namespace_prefix()[0] and landlock_abi() >= 1),
                                                   reason="no user namespaces or Landlock on this machine")]


def test_in_the_default_layout_a_candidate_finds_nothing_of_the_repository_nor_of_the_hosts_tmp(tmp_path,
                                                                                                monkeypatch):
    import modulelens.sandbox.pool as pools

    if not tmp_path.is_relative_to("/tmp"):
        tmp_path = Path(tempfile.mkdtemp(dir="/tmp"))
    project = tmp_path / "project"
    repo = project / ".modulelens"
    project.mkdir()
    (project / "code.py").write_text("# the project's own code\n")
    with modulelens.capture("", name="sm", repo=repo, export=False):
        torch.nn.Softmax(dim=-1)(torch.randn(16, 24))
    card_id = next(c.card_id for c in capture_ops(CaptureOpsRequest(ref="sm", repeats=3),
                                                  ToolContext(repo_root=repo)).cards if "softmax" in c.op)
    marker = f"ml-layout-{uuid.uuid4().hex[:8]}"
    (repo / f"{marker}.txt").write_text("reference outputs")
    host_file = Path("/tmp") / f"{marker}.txt"
    host_file.write_text("host")
    monkeypatch.setenv("MODULELENS_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("PYTHONPATH", str(project))
    monkeypatch.setattr(pools, "_POOLS", {})  # a worker started now, with this environment
    try:
        source = (HERE / "default_layout_reader.py").read_text()
        for key, value in {"REPO": repo, "PROJECT": project, "MARKER": marker}.items():
            source = source.replace(f"__{key}__", str(value))
        r = validate_kernel(ValidateKernelRequest(source_text=source, target=card_id, backend="triton", time=False,
                                                  seeds=1), ToolContext(repo_root=repo))
    finally:
        host_file.unlink()
        for found in pools._POOLS.values():
            found.close()
    assert r.correct and r.verdict == "wrapper", r.reason
    layers = {x.name: x for x in full_report(r).isolation.layers}
    assert not [x for x in layers.values() if not x.in_force], r.isolation.summary()
    assert not [w for w in r.warnings if "not in force" in w], r.warnings
    assert str(repo) in layers["secrets masked"].detail, layers["secrets masked"]
    assert str(tmp_path / "candidates") in layers["private /tmp"].detail, layers["private /tmp"]
    assert "masked in its mount namespace" in layers["signing key and repository unreadable"].detail
    assert layers["checker: signing key and repository unreadable"].in_force
