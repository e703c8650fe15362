"""Where an output may go, and inputs checked for their kind before any work: over MCP an output
outside the project and the repository (``out="/"``, ``"../x.pack"``) is refused before the tool
runs unless the tool takes ``allow_outside`` and it is given; in the CLI, where a person typed it,
it is written and the reply says where. A pack that is not a pack (``/etc/passwd``) fails ``run``
before the script starts, and a script that is not Python names the user's file and line."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from click.testing import CliRunner
from mcp import Client

import modulelens
from modulelens.mcp_server.server import build_server
from modulelens.tools import all_tools


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder holding a repository with a small capture ``blk``; a server working
    directory elsewhere."""
    proj = tmp_path / "project"
    repo = proj / ".modulelens"
    with modulelens.capture("", name="blk", repo=repo, export=False):
        torch.nn.Softmax(dim=-1)(torch.randn(4, 6))
    (tmp_path / "server-cwd").mkdir()
    monkeypatch.chdir(tmp_path / "server-cwd")
    monkeypatch.delenv("MODULELENS_HOME", raising=False)
    return proj


def _mcp(repo: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    async def main():
        async with Client(build_server(all_tools(), repo_root=repo)) as client:
            return [await client.call_tool(name, arguments) for name, arguments in calls]

    return anyio.run(main)


def test_outputs_outside_the_project_are_refused_over_mcp(project: Path):
    repo = project / ".modulelens"
    root_before = set(Path("/").iterdir())
    repro, packed, started, allowed, _exported = _mcp(repo, [
        ("export_repro", {"ref": "blk", "out": "/", "verify": False}),
        ("pack", {"candidates": ["blk.card0:v1"], "out": "../x.pack"}),
        ("start_job", {"tool": "export_repro", "arguments": {"ref": "blk", "out": "/tmp"}}),
        ("pack", {"candidates": ["blk.card0:v1"], "out": "../x.pack", "allow_outside": True}),
        ("export_repro", {"ref": "blk", "out": "../repros", "verify": False, "allow_outside": True}),
    ])
    for r in (repro, packed, started):
        text = r.content[0].text
        assert r.is_error and "outside the project folder" in text and "nothing is written" in text, text
        assert len(text.splitlines()) <= 2, text
    assert "allow_outside" in packed.content[0].text and "allow_outside" in repro.content[0].text  # both take it
    assert set(Path("/").iterdir()) == root_before and not (project.parent / "x.pack").exists()
    assert not (repo / "packs").exists() and not (repo / ".jobs").exists()  # no pack stored, no job started
    text = allowed.content[0].text  # allowed: the tool itself runs (and fails on the missing candidate)
    assert allowed.is_error and "outside the project" not in text and "blk.card0" in text, text
    assert (project.parent / "repros" / "blk_v1.py").is_file()  # export_repro with allow_outside writes there


def test_the_cli_writes_an_output_a_person_typed_outside_the_project_and_says_where(app, project: Path, monkeypatch):
    monkeypatch.chdir(project)
    r = CliRunner().invoke(app, ["export-repro", "blk", "--out", "../elsewhere", "--no-verify", "--json",
                                 "--repo", str(project / ".modulelens")])
    assert r.exit_code == 0, r.output
    assert (project.parent / "elsewhere" / "blk_v1.py").is_file()
    assert "outside the project folder" in r.stdout and str(project.parent / "elsewhere") in r.stdout, r.stdout


SCRIPT = "from pathlib import Path\nPath('ran').write_text('yes')\n"


def test_inputs_of_the_wrong_kind_fail_before_anything_runs(project: Path):
    (project / "train.py").write_text(SCRIPT)
    (project / "notes.md").write_text("# My notes\n\nSome *markdown*, not Python.\n")
    t0 = time.monotonic()
    ran, captured, gathered = _mcp(project / ".modulelens", [
        ("run", {"script": "train.py", "pack": "/etc/passwd"}),
        ("capture_module", {"script": "notes.md"}),
        ("gather_stats", {"script": "notes.md"}),
    ])
    assert time.monotonic() - t0 < 30  # no script worker was started
    assert ran.is_error and "/etc/passwd is not a modulelens pack" in ran.content[0].text, ran.content[0].text
    assert not (project / "ran").exists()
    for r in (captured, gathered):
        text = r.content[0].text
        assert r.is_error and f"{project / 'notes.md'}:3" in text and "not a Python file" in text, text
        assert "modulelens/" not in text
