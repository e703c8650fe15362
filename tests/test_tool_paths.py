"""Paths in requests, through the MCP server (a real mcp.Client) and the CLI: an output path that is
empty, a folder where a file goes (or a file where a folder goes), /dev/null or /proc/self is
refused with one line naming the cause, and nothing is written (no temporary file either); a
relative output lands in the project folder (over MCP: the folder holding the repository, never
the server's working directory; in the CLI: the shell's); a source file is followed through its
symlinks and, over MCP, refused outside the project and the repository unless allow_outside is
given (a person typing it in the CLI means it), and the reply says where it was read from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from click.testing import CliRunner
from mcp import Client

import modulelens
from modulelens.errors import ModuleLensError
from modulelens.mcp_server.server import build_server
from modulelens.paths import write_text
from modulelens.tools import all_tools


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder holding the repository, and a server working directory elsewhere."""
    proj = tmp_path / "project"
    (proj / ".modulelens").mkdir(parents=True)
    (proj / "existing").mkdir()
    (proj / "notes.txt").write_text("mine")
    elsewhere = tmp_path / "server-cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("MODULELENS_HOME", raising=False)
    return proj


def _mcp(repo: Path, name: str, arguments: dict[str, Any]) -> Any:
    async def main():
        async with Client(build_server(all_tools(), repo_root=repo)) as client:
            return await client.call_tool(name, arguments)

    return anyio.run(main)


BAD_OUTPUTS = [
    ("pack", "", "is empty"),
    ("pack", "existing", "is a folder, not a file"),
    ("pack", "/dev/null", "under /dev, a system folder"),
    ("pack", "/proc/self", "under /proc, a system folder"),
    ("pack", "notes.txt/x.pack", "which is a file"),
    ("export_repro", "", "is empty"),
    ("export_repro", "notes.txt", "is not a folder"),
    ("export_repro", "/dev/null", "under /dev, a system folder"),
    ("export_repro", "/proc/self", "under /proc, a system folder"),
]


def _arguments(tool: str, out: str) -> dict[str, Any]:
    return {"candidates": ["blk.card2:v1"], "out": out} if tool == "pack" else {"ref": "blk", "out": out}


@pytest.mark.parametrize("tool,out,cause", BAD_OUTPUTS, ids=[f"{t}-{o or 'empty'}" for t, o, _ in BAD_OUTPUTS])
def test_mcp_refuses_an_output_path_and_writes_nothing(project: Path, tool: str, out: str, cause: str):
    before, cwd_before = _tree(project), _tree(Path.cwd())
    r = _mcp(project / ".modulelens", tool, _arguments(tool, out))
    text = r.content[0].text
    assert r.is_error and cause in text, text
    assert "Error executing tool" not in text and "out" in text.splitlines()[0]
    assert len(text.splitlines()) <= 2  # the message, then the hint
    assert _tree(project) == before and _tree(Path.cwd()) == cwd_before  # nothing written, no .tmp file


@pytest.mark.parametrize("out,cause", [("", "--out is empty"), ("existing", "is a folder"),
                                       ("/dev/null", "under /dev"), ("/proc/self", "under /proc")])
def test_cli_refuses_an_output_path_and_writes_nothing(app, project: Path, monkeypatch, out: str, cause: str):
    monkeypatch.chdir(project)
    before = _tree(project)
    r = CliRunner().invoke(app, ["pack", "blk.card2:v1", "--out", out, "--repo", str(project / ".modulelens")])
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert r.stderr.startswith("error: ") and cause in r.stderr.splitlines()[0], r.stderr
    assert _tree(project) == before


@pytest.fixture
def captured(project: Path) -> Path:
    """The project's repository holding a small capture ``blk`` (written here, so trusted)."""
    repo = project / ".modulelens"
    with modulelens.capture("", name="blk", repo=repo, export=False):
        torch.nn.Softmax(dim=-1)(torch.randn(4, 6))
    return repo


def test_a_relative_output_goes_to_the_project_folder_over_mcp_and_the_shell_folder_in_the_cli(
        app, captured: Path, project: Path, monkeypatch):
    r = _mcp(captured, "export_repro", {"ref": "blk", "out": "repros", "verify": False})
    assert not r.is_error, r.content[0].text
    data = r.structured_content
    assert Path(data["path"]) == project / "repros" / "blk_v1.py" and Path(data["path"]).is_file()
    assert (project / "repros" / "blk_v1_data").is_dir()
    assert _tree(Path.cwd()) == set()  # the server's own working directory is left alone
    assert not [p for p in _tree(project / "repros") if p.endswith(".tmp") or p.startswith(".repro.")]

    shell = project / "existing"
    monkeypatch.chdir(shell)
    r = CliRunner().invoke(app, ["export-repro", "blk", "--out", "here", "--no-verify", "--repo", str(captured)])
    assert r.exit_code == 0, r.output
    assert (shell / "here" / "blk_v1.py").is_file()


def test_write_text_leaves_no_temporary_file_when_it_fails(tmp_path: Path):
    target = tmp_path / "a-folder"
    (target / "inside").mkdir(parents=True)
    with pytest.raises(ModuleLensError, match="cannot write .*a-folder"):
        write_text(target, "x")  # the rename onto a folder fails
    assert sorted(os.listdir(tmp_path)) == ["a-folder"] and os.listdir(target) == ["inside"]


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


MODEL_NEW = """import torch
class ModelNew(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
    def forward(self, x):
        return torch.softmax(x, dim=-1)
"""


@pytest.fixture
def planted(tmp_path_factory) -> Path:
    """A folder outside the project with a planted secret (named like a source, and not)."""
    folder = tmp_path_factory.mktemp("outside")
    (folder / "secret.cpp").write_text("// SECRET-TOKEN-1234\n")
    (folder / "shadow").write_text("root:SECRET-TOKEN-1234\n")
    (folder / "model_new.py").write_text(MODEL_NEW)
    return folder


def _candidates(repo: Path) -> list[str]:
    return sorted(p.name for p in (repo / "candidates").glob("*")) if (repo / "candidates").is_dir() else []


def test_a_symlinked_source_outside_the_project_is_refused(app, captured: Path, project: Path, planted: Path,
                                                           monkeypatch):
    (project / "k.cpp").symlink_to(planted / "secret.cpp")
    args = {"source": "k.cpp", "target": "blk/0", "backend": "cpp"}
    for tool, extra in (("validate_kernel", {}), ("add_search_child", {"search_id": "s"})):
        arguments = {**args, **extra} if tool == "validate_kernel" else {"search_id": "s", "source": "k.cpp"}
        r = _mcp(captured, tool, arguments)
        text = r.content[0].text
        assert r.is_error and "outside the project folder" in text and "allow_outside" in text, text
        assert "secret" not in text.lower()  # where the link leads is not told
    monkeypatch.chdir(project)  # a person typing the path in the CLI means it: read (here: no opset blk, so no candidate)
    r = CliRunner().invoke(app, ["validate-kernel", "--source", "k.cpp", "--target", "blk/0", "--backend", "cpp",
                                 "--repo", str(captured)])
    assert r.exit_code == 2 and "outside the project folder" not in r.stderr and "opset" in r.stderr, r.output
    assert _candidates(captured) == []  # nothing was read into the repository

    (project / "k2.cpp").symlink_to(planted / "shadow")  # even when allowed, only files named like sources
    r = _mcp(captured, "validate_kernel", {**args, "source": "k2.cpp", "allow_outside": True})
    assert r.is_error and "not named like a kernel source" in r.content[0].text
    assert _candidates(captured) == []


def test_a_source_that_is_not_a_regular_file_is_refused(captured: Path, project: Path, planted: Path):
    (project / "dir.cpp").mkdir()
    (project / "loop.cpp").symlink_to(project / "loop.cpp")
    for source, cause in (("dir.cpp", "is not a regular file"), ("missing.cpp", "does not exist"),
                          ("loop.cpp", "cannot follow the path"), ("", "give exactly one of"),
                          (str(planted / "missing.cpp"), "outside the project folder")):  # nothing said of outside
        r = _mcp(captured, "validate_kernel", {"source": source, "target": "blk/0", "backend": "cpp"})
        assert r.is_error and cause in r.content[0].text, (source, r.content[0].text)


def test_allow_outside_reads_it_and_the_reply_says_from_where(captured: Path, project: Path, planted: Path):
    (project / "mine.py").symlink_to(planted / "model_new.py")
    r = _mcp(captured, "validate_kernel", {"source": "mine.py", "target": "blk", "allow_outside": True,
                                           "time": False, "seeds": 1})
    assert not r.is_error, r.content[0].text
    data = r.structured_content
    assert data["source_file"] == str((planted / "model_new.py").resolve())
    assert any("outside the project" in w and str(planted) in w and "allow_outside" in w for w in data["warnings"])


# --------------------------------------------------------------------------------------------
# Inputs: scripts and pack files a tool reads
# --------------------------------------------------------------------------------------------


TINY_SCRIPT = """import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
print(float(model(torch.randn(2, 4)).sum()))
"""


@pytest.fixture
def scripted(project: Path) -> Path:
    """The project with a tiny script, a folder named like a pack and a file that is not a pack;
    the server's working directory (elsewhere) holds a decoy script of the same name."""
    (project / "train.py").write_text(TINY_SCRIPT)
    (project / "folder.pack").mkdir()
    (project / "junk.pack").write_text("not a pack")
    (Path.cwd() / "train.py").write_text("raise SystemExit('the decoy in the server cwd ran')\n")
    return project


def _error(r: Any) -> str:
    text = r.content[0].text
    assert r.is_error and "Traceback" not in text and "Error executing tool" not in text, text
    assert len(text.splitlines()) <= 2, text  # the message, then the hint
    return text


MISSING_INPUTS = [  # (tool, arguments, the argument named, the path as resolved, relative to the project)
    ("run", {"script": "missing.py", "pack": "k"}, "script 'missing.py' not found", "missing.py"),
    ("run", {"script": "train.py", "pack": "gone/k.pack"}, "pack 'gone/k.pack' is neither a file", "gone/k.pack"),
    ("run", {"script": "train.py", "pack": "folder.pack"}, "pack 'folder.pack' is a folder, not a file",
     "folder.pack"),
    ("check_pack", {"pack": "gone.pack"}, "pack 'gone.pack' is neither a file", "gone.pack"),
    ("capture_module", {"script": "sub/missing.py"}, "script 'sub/missing.py' not found", "sub/missing.py"),
    ("capture_ops", {"ref": "missing.py"}, "ref 'missing.py' not found", "missing.py"),
    ("gather_stats", {"script": "missing.py"}, "script 'missing.py' not found", "missing.py"),
    ("gather_stats", {"script": "folder.pack"}, "script 'folder.pack' is a folder", "folder.pack"),
    ("push", {"ref": "folder.pack", "kind": "packs", "to": "wandb://team/proj"}, "ref 'folder.pack' is a folder",
     "folder.pack"),
]


@pytest.mark.parametrize("tool,arguments,named,resolved", MISSING_INPUTS,
                         ids=[f"{t}-{next(iter(a.values()))}" for t, a, _, _ in MISSING_INPUTS])
def test_mcp_resolves_an_input_path_in_the_project_and_refuses_a_missing_one_in_one_line(
        scripted: Path, tool: str, arguments: dict[str, Any], named: str, resolved: str):
    before = _tree(scripted)
    text = _error(_mcp(scripted / ".modulelens", tool, arguments))
    first = text.splitlines()[0]
    assert named in first and str(scripted / resolved) in first, text  # the argument, the path as resolved
    assert str(scripted) in text.splitlines()[-1]  # the fix: relative paths are taken from the project folder
    assert _tree(scripted) == before


def test_a_relative_pack_file_is_read_from_the_project_not_the_server_cwd(scripted: Path):
    (Path.cwd() / "junk.pack").write_text("{}")  # a decoy: read from here, the error would differ
    for tool, arguments in (("check_pack", {"pack": "junk.pack"}),
                            ("run", {"script": "train.py", "pack": "junk.pack"})):
        text = _error(_mcp(scripted / ".modulelens", tool, arguments))
        assert f"{scripted / 'junk.pack'} is not a modulelens pack (not JSON" in text, text


PROJECT_SCRIPT = """import torch
from projlib import Net  # a package of the project: the working folder is on sys.path
width = int(open("data.txt").read())  # relative to the folder the script runs in
Net(width)(torch.randn(2, width))
"""
PROJECT_LIB = """import torch
class Net(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = torch.nn.Linear(width, 3)
    def forward(self, x):
        return self.fc(x).relu()
"""


def test_a_script_runs_in_the_project_folder_over_mcp_and_the_capture_records_it(scripted: Path):
    """A script found by a relative path runs with the project folder as its working directory (where
    the user runs it from the shell), not the server's: it reads ./data.txt and imports a package of
    the project from there, and the capture records that folder (RunSource.cwd, sys_path for replay)."""
    from modulelens.capture.manifest import CaptureManifest
    from modulelens.repo import Repository

    (scripted / "scripts").mkdir()
    (scripted / "scripts" / "train.py").write_text(PROJECT_SCRIPT)
    (scripted / "projlib").mkdir()
    (scripted / "projlib" / "__init__.py").write_text(PROJECT_LIB)
    (scripted / "data.txt").write_text("4")
    (Path.cwd() / "data.txt").write_text("7")  # a decoy in the server's working directory
    r = _mcp(scripted / ".modulelens", "capture_module", {"script": "scripts/train.py", "export": False})
    assert not r.is_error, r.content[0].text
    got = r.structured_content
    assert got["script_file"] == str(scripted / "scripts" / "train.py")
    assert got["class_path"] == "projlib:Net" and got["inputs"][0]["shape"] == [2, 4]  # the project's data.txt
    manifest = Repository(scripted / ".modulelens").open("captures", got["ref"]).manifest_as(CaptureManifest)
    assert manifest.source.cwd == str(scripted)
    assert str(scripted) in manifest.sys_path and str(Path.cwd()) not in manifest.sys_path


TRAINING_SCRIPT = """import torch
width = int(open("data.txt").read())  # relative to the folder the script runs in
model = torch.nn.Linear(width, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    model(torch.randn(2, width)).sum().backward()
    opt.step()
"""


def test_gather_stats_runs_the_script_in_the_project_folder_over_mcp(scripted: Path):
    from modulelens.repo import Repository
    from modulelens.stats.manifest import stats_manifest

    (scripted / "fit.py").write_text(TRAINING_SCRIPT)
    (scripted / "data.txt").write_text("4")  # the server's working directory has none
    r = _mcp(scripted / ".modulelens", "gather_stats", {"script": "fit.py", "plots": False})
    assert not r.is_error, r.content[0].text
    art = Repository(scripted / ".modulelens").open("stats", r.structured_content["run_id"])
    assert stats_manifest(art).source.cwd == str(scripted)


def test_the_cli_reads_a_relative_input_from_the_shell_folder(app, scripted: Path, monkeypatch):
    shell = scripted / "existing"
    monkeypatch.chdir(shell)
    r = CliRunner().invoke(app, ["run", "train.py", "--pack", "k", "--repo", str(scripted / ".modulelens")])
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert f"script 'train.py' not found: {shell / 'train.py'} does not exist" in r.stderr.splitlines()[0], r.stderr
