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
from modulelens.repo.trust import UntrustedArtifact, config_dir, is_trusted, require_trusted


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
    from modulelens.repo.store import sha256_file

    data["files"]["../../../../x.py"] = sha256_file(tmp_path / "x.py")
    manifest.write_text(json.dumps(data))
    art = Repository(repo).open("captures", "tiny")
    with pytest.raises(ChecksumMismatch, match="outside the artifact"):
        art.file("../../../../x.py")
    from modulelens.errors import ModuleLensError
    from modulelens.repo.trust import trust

    with pytest.raises(ModuleLensError, match="cannot be trusted"):
        trust(art)
