"""The byte budget covers the weights: a weight above it is stored shape-only (replay says its outputs
are not comparable), the export program never holds a second copy of the weights, and the memory a
capture takes above the run stays within a small multiple of what it keeps."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import modulelens
from modulelens.capture import capture_manifest


def _kept_bytes(art) -> int:
    return sum(f.stat().st_size for f in Path(art.path).rglob("*") if f.is_file())


def test_a_weight_above_the_budget_is_stored_shape_only_and_replay_says_so(tmp_path):
    torch.manual_seed(0)
    with modulelens.capture("", name="wide", repo=tmp_path, max_capture_bytes=256 * 1024) as cap, torch.no_grad():
        nn.Linear(256, 512)(torch.randn(4, 256))  # a 512 KiB weight, small activations
    man = capture_manifest(cap.artifact)
    assert man.weights_storage.mode == "shape_only" and man.weights_storage.total_bytes == (256 * 512 + 512) * 4
    assert set(man.shape_only) == {"weight", "bias"} and man.weight_specs()["weight"].stats.std > 0
    assert man.activations.mode == "full" and any("raise max_capture_bytes" in n for n in man.notes)
    assert not cap.artifact.has_file("weights.safetensors")
    assert cap.artifact.file("program.pt2").stat().st_size < 64 * 1024  # the program holds no weights
    for strategy in ("source", "export"):
        rep = modulelens.replay_module("wide", strategy=strategy, repo=str(tmp_path))
        assert not rep.compared and not rep.match and {"weight", "bias"} <= set(rep.synthesized)
        assert any("not comparable" in n for n in rep.notes)


def test_stored_weights_are_kept_once_and_export_replays_from_them(tmp_path):
    torch.manual_seed(0)
    with modulelens.capture("", name="once", repo=tmp_path) as cap, torch.no_grad():
        nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 8))(torch.randn(4, 256))
    man = capture_manifest(cap.artifact)
    weights = cap.artifact.file("weights.safetensors").stat().st_size
    assert man.weights_storage.mode == "full" and man.export.weights == "separate" and man.schema_version == 2
    assert cap.artifact.file("program.pt2").stat().st_size < weights / 4
    rep = modulelens.replay_module("once", strategy="export", repo=str(tmp_path))
    assert rep.exact and rep.max_abs_error == 0.0


def _hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("budget_mib, bound", [(256, "1.5 x kept + 48 MiB"), (16, "16 MiB")])
def test_capture_memory_stays_within_a_multiple_of_what_it_keeps(budget_mib, bound):
    """A 64 MiB weight: stored (one copy), or above a 16 MiB budget (statistics only, computed in
    small chunks: no weight-sized copy, nor a fraction of one that grows with the weight). The peak
    resident memory of the capture above the run's is measured with the kernel's high-water mark."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets the high-water mark to the current RSS
    except OSError:
        pytest.skip("this kernel does not let a process reset its memory high-water mark")
    model, x = nn.Linear(1024, 16384), torch.randn(8, 1024)
    with torch.no_grad():
        model(x)
    Path("/proc/self/clear_refs").write_text("5")
    before = _rss_mib()
    with tempfile.TemporaryDirectory() as repo:
        with modulelens.capture("", name="w", repo=repo, max_capture_bytes=budget_mib * 2**20) as cap, torch.no_grad():
            model(x)
        over, kept = _hwm_mib() - before, _kept_bytes(cap.artifact) / 2**20
    limit = 1.5 * kept + 48 if budget_mib == 256 else 16
    assert over <= limit, f"the capture took {over:.0f} MiB above the run, keeping {kept:.1f} MiB (bound: {bound})"
