"""One job runtime under both front ends: a job started over MCP (start_job) is listed and stopped
in the web UI, and a job the UI started is read and cancelled with job_status; either way the
job ends cancelled and the user's script (a worker's process) is gone."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import anyio
import mcp
import pytest
from conftest import wait_until
from starlette.testclient import TestClient

from modulelens.mcp_server.server import build_server
from modulelens.tools import all_tools
from modulelens.ui.app import build_app
from modulelens.ui.state import UiSettings

LOOP = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\nwhile True:\n    time.sleep(0.05)\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def project(tmp_path):
    """(project folder holding loop.py, repository inside it, the file loop.py writes its pid to);
    the script's process is killed at the end whatever happened."""
    (tmp_path / "loop.py").write_text(LOOP)
    pid_file = tmp_path / "pid"
    yield tmp_path, tmp_path / ".modulelens", pid_file
    if pid_file.is_file() and pid_file.read_text():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _mcp(repo: Path, tool: str, arguments: dict) -> dict:
    async def main():
        async with mcp.Client(build_server(all_tools(), repo_root=repo)) as c:
            reply = await c.call_tool(tool, arguments)
            assert not reply.is_error, reply.content
            return reply.structured_content

    return anyio.run(main)


def _ui(project: Path, repo: Path) -> TestClient:
    return TestClient(build_app(UiSettings(repo_root=repo, project_root=project)), base_url="http://127.0.0.1:8765")


def _post(client: TestClient, url: str, body: dict):
    return client.post(url, content=json.dumps(body),
                       headers={"X-ModuleLens-Action": "1", "Content-Type": "application/json"})


def _script_pid(pid_file: Path) -> int:
    wait_until(lambda: pid_file.is_file() and pid_file.read_text(), 120, "the job's script to start")
    return int(pid_file.read_text())


@pytest.mark.slow
def test_a_job_started_over_mcp_is_listed_and_stopped_in_the_ui(project):
    folder, repo, pid_file = project
    started = _mcp(repo, "start_job", {"tool": "gather_stats", "arguments": {
        "script": str(folder / "loop.py"), "script_args": [str(pid_file)], "every": 1}})
    job = started["job"]
    pid = _script_pid(pid_file)  # the server that started it is gone: the job runs on
    with _ui(folder, repo) as ui:
        listed = {j["id"]: j for j in ui.get("/api/jobs").json()["jobs"]}
        assert listed[job]["state"] == "running" and listed[job]["tool"] == "gather_stats", listed
        assert listed[job]["action"] is None and listed[job]["subject"] == str(folder / "loop.py")
        assert ui.get("/jobs").status_code == 200
        assert _post(ui, f"/api/jobs/{job}/stop", {}).status_code == 200
        wait_until(lambda: ui.get(f"/api/jobs/{job}").json()["state"] != "running", 45, "the job to stop")
        assert ui.get(f"/api/jobs/{job}").json()["state"] == "stopped"
    wait_until(lambda: not _alive(pid), 15, "the script's process to end")
    status = _mcp(repo, "job_status", {"job": job})
    assert status["state"] == "cancelled" and "CallCancelled" in status["error"], status


@pytest.mark.slow
def test_a_job_started_in_the_ui_is_read_and_cancelled_with_job_status(project):
    folder, repo, pid_file = project
    with _ui(folder, repo) as ui:
        r = _post(ui, "/api/jobs", {"action": "gather_stats",
                                    "params": {"script": "loop.py", "script_args": str(pid_file), "every": 1}})
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        pid = _script_pid(pid_file)
        status = _mcp(repo, "job_status", {"job": job})
        assert (status["state"], status["tool"]) == ("running", "gather_stats") and status["next"], status
        cancelled = _mcp(repo, "job_status", {"job": job, "cancel": True})
        assert cancelled["state"] == "cancelled" and not cancelled["owner"], cancelled
        assert ui.get(f"/api/jobs/{job}").json()["state"] == "stopped"
    wait_until(lambda: not _alive(pid), 15, "the script's process to end")


@pytest.mark.slow
def test_a_job_stopped_before_its_process_took_over_ends_cancelled(project):
    """The stop request comes before the job process wrote its owner: it sees the request when it
    starts, its tool stops at once and its script never runs on."""
    from modulelens.jobs import JobTable

    folder, repo, pid_file = project
    table = JobTable(repo)
    job = table.start("gather_stats", {"script": str(folder / "loop.py"), "script_args": [str(pid_file)],
                                       "every": 1}, cwd=folder).job
    record = table.cancel(job)
    assert record.state == "cancelled" and record.error_type == "CallCancelled", record
    assert [r.job for r in table.jobs()] == [job]
    if pid_file.is_file() and pid_file.read_text():
        wait_until(lambda: not _alive(int(pid_file.read_text())), 15, "the script's process to end")


def test_the_clis_long_calls_are_listed_as_jobs_with_their_end(app, tmp_path, monkeypatch):
    """A long CLI call (export-repro, run) is a job of the repository while it runs and keeps its
    ending (result or error); a quick one (list) is not; no repository is created for a job."""
    import torch
    from click.testing import CliRunner

    import modulelens
    from modulelens.jobs import JobTable

    repo = tmp_path / ".modulelens"
    with modulelens.capture("", name="blk", repo=repo, export=False):
        torch.nn.Softmax(dim=-1)(torch.randn(2, 3))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["export-repro", "blk", "--no-verify", "--repo", str(repo)]).exit_code == 0
    assert runner.invoke(app, ["run", "missing.py", "--pack", "k", "--repo", str(repo)]).exit_code == 2
    assert runner.invoke(app, ["list", "captures", "--repo", str(repo)]).exit_code == 0
    failed, done = JobTable(repo).jobs()
    assert (done.tool, done.state, done.subject, done.owner) == ("export_repro", "done", "blk", ""), done
    assert done.result and done.result["path"] == str(tmp_path / "repros" / "blk_v1.py")
    assert (failed.tool, failed.state, failed.error_type) == ("run", "failed", "ModuleLensError"), failed
    assert "script 'missing.py' not found" in failed.error and failed.subject == "missing.py"
    assert runner.invoke(app, ["run", "x.py", "--pack", "k", "--repo", str(tmp_path / "typo")]).exit_code == 2
    assert not (tmp_path / "typo").exists()


@pytest.mark.slow
def test_a_cli_call_is_stopped_from_the_ui_like_a_job(project):
    import subprocess
    import sys

    folder, repo, pid_file = project
    repo.mkdir()
    cli = subprocess.Popen([sys.executable, "-m", "modulelens", "gather-stats", "loop.py", str(pid_file), "--every",
                            "1", "--repo", str(repo)], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        pid = _script_pid(pid_file)
        with _ui(folder, repo) as ui:
            [listed] = ui.get("/api/jobs").json()["jobs"]
            assert (listed["tool"], listed["state"], listed["subject"]) == ("gather_stats", "running", "loop.py")
            assert _post(ui, f"/api/jobs/{listed['id']}/stop", {}).status_code == 200
            out, err = cli.communicate(timeout=45)
            assert cli.returncode == 2 and "cancelled" in err, (out, err)
            assert ui.get(f"/api/jobs/{listed['id']}").json()["state"] == "stopped"
        wait_until(lambda: not _alive(pid), 15, "the script's process to end")
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
