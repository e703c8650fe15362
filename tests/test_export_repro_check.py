"""export-repro's self-check: a limit the user sets, a check that outran it keeps the file as
"written, not checked", a failed check takes back what was written, and user files that start
with ``from __future__`` imports give a repro that runs. Drives the CLI (click runner)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FUTURE = '''\
from __future__ import annotations

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * self.scale


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''

# Its output depends on the process it runs in: no file can reproduce its capture.
PID_DEPENDENT = '''\
import os

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x + float(os.getpid())


def get_inputs():
    return [torch.zeros(4)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("repo")


def _capture(app, repo: Path, folder: Path, name: str, text: str) -> str:
    from click.testing import CliRunner

    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    r = CliRunner().invoke(app, ["capture-module", str(path), "--name", name, "--repo", str(repo), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["ref"]


@pytest.fixture(scope="module")
def future_ref(app, repo, tmp_path_factory) -> str:
    return _capture(app, repo, tmp_path_factory.mktemp("user"), "future", FUTURE)


def test_a_user_file_with_future_imports_gives_a_repro_that_runs(cli, repo, future_ref, tmp_path):
    code, data, r = cli("export-repro", future_ref, "--out", tmp_path, "--repo", repo, "--json")
    assert code == 0, r.output
    assert data["verified"] is True and data["max_abs_error"] == 0.0
    text = Path(data["path"]).read_text()
    assert text.count("from __future__ import annotations") == 1
    assert text.index("from __future__ import annotations") < text.index("import torch")


def test_a_check_past_its_limit_keeps_the_file_as_written_not_checked(cli, repo, future_ref, tmp_path):
    # No interpreter imports torch in 0.2 s: the check is stopped at its limit.
    code, data, r = cli("export-repro", future_ref, "--out", tmp_path, "--check-seconds", "0.2", "--repo", repo,
                        "--json")
    assert code == 0, r.output
    assert data["verified"] is None and data["max_abs_error"] is None
    (warning,) = [w for w in data["warnings"] if w.startswith("written, not checked")]
    assert data["path"] in warning and "0.2 s" in warning and "--check-seconds" in warning
    assert Path(data["path"]).is_file() and Path(data["data_dir"]).is_dir()


def test_a_failed_check_removes_what_it_wrote(app, cli, repo, tmp_path):
    ref = _capture(app, repo, tmp_path, "pid", PID_DEPENDENT)
    out = tmp_path / "repros"
    code, err, r = cli("export-repro", ref, "--out", out, "--repo", repo, "--json")
    assert code == 2, r.output
    assert "failed its check" in err["error"] and "max abs error" in err["error"]
    assert "removed" in err["error"] and "--no-verify" in err["hint"]
    assert not out.exists()  # the folder this call made goes with the file and its data
    kept = tmp_path / "kept"
    (kept / "mine.txt").parent.mkdir()
    (kept / "mine.txt").write_text("the user's")
    code, err, r = cli("export-repro", ref, "--out", kept, "--repo", repo, "--json")
    assert code == 2, r.output
    assert [p.name for p in kept.iterdir()] == ["mine.txt"]


def test_a_limit_that_is_not_a_positive_number_is_refused(cli, repo, future_ref, tmp_path):
    code, err, r = cli("export-repro", future_ref, "--out", tmp_path, "--check-seconds", "0", "--repo", repo, "--json")
    assert code == 2, r.output
    assert "check-seconds" in err["error"] or "check_seconds" in err["error"]
    assert not any(tmp_path.iterdir())
