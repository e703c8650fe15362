"""Trust: artifacts written here are signed; copied, crafted or edited ones run no code (replay
with any strategy, export-repro, validation against their cards) until the `trust` step, which
first shows what would run."""

from __future__ import annotations

import json
import shutil
import stat

import pytest
import torch
import torch.nn as nn

import modulelens
from modulelens.errors import ChecksumMismatch
from modulelens.repo import Repository
from modulelens.repo import UntrustedArtifact, config_dir, is_trusted, require_trusted


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.lin(x))


@pytest.fixture(scope="module")
def signed_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("trust-repo")
    with modulelens.capture("", name="tiny", repo=repo, export=True):
        Tiny()(torch.randn(2, 4))
    return repo


@pytest.fixture
def copied_repo(signed_repo, tmp_path, monkeypatch):
    """The same capture as seen by another machine (another key)."""
    monkeypatch.setenv("MODULELENS_CONFIG_DIR", str(tmp_path / "other-machine"))
    copy = tmp_path / "copied"
    shutil.copytree(signed_repo, copy)
    return copy


def test_written_here_is_trusted_and_the_key_is_private(signed_repo):
    art = Repository(signed_repo).open("captures", "tiny")
    assert is_trusted(art.path)
    require_trusted(art, "replay it")
    mode = stat.S_IMODE((config_dir() / "key").stat().st_mode)
    assert mode == 0o600


@pytest.mark.parametrize("strategy", ["source", "export", "auto"])
def test_a_copied_capture_replays_with_no_strategy_until_trusted(cli, copied_repo, strategy):
    code, _, r = cli("replay-module", "tiny", "--strategy", strategy, "--repo", copied_repo)
    assert code != 0 and "not trusted" in r.output and "Traceback" not in r.output, r.output
    assert "modulelens trust tiny:v1" in r.output


def test_export_repro_of_a_copied_capture_is_refused(cli, copied_repo, tmp_path):
    code, _, r = cli("export-repro", "tiny", "--out", tmp_path / "repros", "--repo", copied_repo)
    assert code != 0 and "not trusted" in r.output, r.output
    assert not (tmp_path / "repros").exists()


def test_trust_shows_what_would_run_then_trusts(cli, copied_repo):
    code, data, r = cli("trust", "tiny", "--repo", copied_repo, "--json")
    assert code == 0, r.output
    assert data["trusted"] is False and data["signed"] is False
    assert "program.pt2" in data["code_files"]
    assert any(p.endswith(":Tiny") for p in data["class_paths"]), data["class_paths"]
    code, data, r = cli("trust", "tiny", "--yes", "--repo", copied_repo, "--json")
    assert code == 0 and data["signed"] is True, r.output
    code, data, r = cli("replay-module", "tiny", "--strategy", "export", "--repo", copied_repo, "--json")
    assert code == 0 and data["match"] is True, r.output


def test_an_edited_manifest_is_no_longer_trusted(cli, signed_repo, tmp_path):
    repo = tmp_path / "edited"
    shutil.copytree(signed_repo, repo)
    manifest = repo / "captures" / "tiny" / "v1" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["sys_path"] = ["/somewhere/else"]
    manifest.write_text(json.dumps(data))
    art = Repository(repo).open("captures", "tiny")
    with pytest.raises(UntrustedArtifact):
        require_trusted(art, "replay it")
    code, data, r = cli("trust", "tiny", "--repo", repo, "--json")
    assert "/somewhere/else" in data["escaping_paths"]


def test_paths_outside_the_artifact_are_never_followed(signed_repo, tmp_path):
    repo = tmp_path / "crafted"
    shutil.copytree(signed_repo, repo)
    (tmp_path / "x.py").write_text("raise SystemExit('ran')\n")
    manifest = repo / "captures" / "tiny" / "v1" / "manifest.json"
    data = json.loads(manifest.read_text())
    from modulelens.repo import sha256_file

    data["files"]["../../../../x.py"] = sha256_file(tmp_path / "x.py")
    manifest.write_text(json.dumps(data))
    art = Repository(repo).open("captures", "tiny")
    with pytest.raises(ChecksumMismatch, match="outside the artifact"):
        art.file("../../../../x.py")
    from modulelens.errors import ModuleLensError
    from modulelens.repo import trust_artifact as trust

    with pytest.raises(ModuleLensError, match="cannot be trusted"):
        trust(art)


@pytest.fixture(scope="module")
def repo_with_cards(tmp_path_factory):
    from modulelens.registry import ToolContext
    from modulelens.tools.capture_ops import CaptureOpsRequest, capture_ops

    repo = tmp_path_factory.mktemp("crafted-src")
    with modulelens.capture("", name="tiny", repo=repo, export=True):
        Tiny()(torch.randn(2, 4))
    capture_ops(CaptureOpsRequest(ref="tiny", repeats=3), ToolContext(repo_root=repo))
    return repo


class _Payload:
    """Unpickling it opens (creates) the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def crafted_repo(repo_with_cards, tmp_path, monkeypatch):
    """A capture crafted so that importing, unpickling or running anything it names creates
    ``marker``: constructor and class paths of a module that does so on import, an inputs spec
    naming ``os:system`` and that module, a stored source outside the artifact, a pickled module."""
    import pickle

    from modulelens.repo import sha256_file

    monkeypatch.setenv("MODULELENS_CONFIG_DIR", str(tmp_path / "other-machine"))
    marker = tmp_path / "ran-code"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').close()\nEvil = boom = print\n")
    (tmp_path / "x.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    repo = tmp_path / "crafted"
    shutil.copytree(repo_with_cards, repo)
    folder = repo / "captures" / "tiny" / "v1"
    (folder / "module.pkl").write_bytes(pickle.dumps(_Payload(str(marker))))
    manifest = folder / "manifest.json"
    data = json.loads(manifest.read_text())
    data["class_path"] = "evilmod:Evil"
    data["sys_path"] = [str(evil)]
    data["init"] = {"$": "module", "cls": "evilmod:Evil", "args": [{"$": "callable", "path": "os:system"}],
                    "kwargs": {}}
    data["inputs"]["args"]["items"].append({"$": "callable", "path": "evilmod:boom"})
    data["sources"] = {"__main__": {"file": "../../../../x.py", "original": "x.py"}}
    data["strategies"] = ["source", "export", "pickle"]
    data["files"]["module.pkl"] = sha256_file(folder / "module.pkl")
    manifest.write_text(json.dumps(data))
    return repo, marker


def test_showing_and_listing_a_crafted_capture_runs_no_code(cli, crafted_repo):
    repo, marker = crafted_repo
    for args in (["show", "capture", "tiny"], ["show", "capture", "tiny", "--tensors"], ["list", "captures"],
                 ["list", "opsets"], ["list", "cards", "tiny"], ["trust", "tiny"]):
        code, _, r = cli(*args, "--repo", repo, "--json")
        assert "Traceback" not in r.output, (args, r.output)
        assert not marker.exists(), f"{args} ran code from the crafted capture"
    code, data, r = cli("trust", "tiny", "--repo", repo, "--json")
    assert any("evilmod" in p for p in data["class_paths"]), data
    assert "module.pkl" in data["code_files"], data


@pytest.mark.parametrize("args", [
    ["replay-module", "tiny", "--strategy", "source"],
    ["replay-module", "tiny", "--strategy", "export"],
    ["replay-module", "tiny", "--strategy", "pickle", "--trust-pickle"],
    ["replay-module", "tiny"],
    ["export-repro", "tiny"],
])
def test_replaying_or_exporting_a_crafted_capture_is_refused_untrusted(cli, crafted_repo, tmp_path, args):
    repo, marker = crafted_repo
    extra = ["--out", tmp_path / "repros"] if args[0] == "export-repro" else []
    code, _, r = cli(*args, *extra, "--repo", repo)
    assert code != 0 and "not trusted" in r.output and "Traceback" not in r.output, r.output
    assert not marker.exists()


def test_a_private_tmp_binds_back_the_folders_under_tmp_the_candidate_needs(monkeypatch, tmp_path):
    """A checkout, a virtualenv or a build folder under /tmp no longer turns the private /tmp off:
    the tmpfs covers the host's /tmp and only the folders the candidate needs are bound back in,
    each from a descriptor opened before the tmpfs covered it (outermost folders only)."""
    import tempfile
    from pathlib import Path

    from modulelens.sandbox import containment

    base = Path(tempfile.mkdtemp(dir="/tmp"))
    (base / "checkout" / "modulelens").mkdir(parents=True)
    (base / "build").mkdir()
    calls = []

    class Recording:
        def mount(self, source, target, fstype, flags, data):
            calls.append((source, target, fstype))
            return 0

        def umount2(self, target, flags):
            raise AssertionError("nothing to undo")

    monkeypatch.setattr(containment.os, "getpid", lambda: 1)  # as PID 1 of its namespace
    monkeypatch.setattr(containment, "_libc", Recording())
    try:
        layer = containment.private_tmp(["/usr/lib/python3", str(base / "checkout" / "modulelens"),
                                         str(base / "checkout"), str(base / "build"), "/srv/scratch"])
    finally:
        import shutil

        shutil.rmtree(base)
    assert layer.in_force, layer.detail
    assert calls[0] == (b"tmpfs", b"/tmp", b"tmpfs")
    bound = [(target.decode(), source.decode().startswith("/proc/self/fd/")) for source, target, _ in calls[1:]]
    assert bound == [(str(base / "build"), True), (str(base / "checkout"), True)], calls
    assert layer.detail == f"its own tmpfs; bound in from the host's /tmp: {base / 'build'}, {base / 'checkout'}"
