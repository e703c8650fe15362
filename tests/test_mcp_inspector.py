"""The MCP server driven by another client: the MCP Inspector CLI (TypeScript SDK), which starts a
fresh server over stdio for every command and gives up on a request after 60 s. A cheap tool is
called directly; a capture goes through the long-running path (start_job, then job_status from
later commands, each with a new server process: the job outlives them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSPECTOR = "@modelcontextprotocol/inspector@0.15.0"
SCRIPT = """import torch
torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())(torch.randn(2, 4))
"""


def _inspector(repo: Path, method: str, tool_name: str | None = None, timeout: float = 240,
               **arguments: str) -> subprocess.CompletedProcess[str]:
    """One Inspector CLI command against ``python -m modulelens mcp --repo REPO``. (``--tool-arg``
    takes several values: a plain option must follow it before ``--`` and the server command.)"""
    tool_args = [a for key, value in arguments.items() for a in ("--tool-arg", f"{key}={value}")]
    cmd = ["npx", "-y", "--prefer-offline", INSPECTOR, "--cli", "-e", f"PYTHONPATH={ROOT}",
           "-e", "OMP_NUM_THREADS=1", *tool_args, "--method", method, *(["--tool-name", tool_name] if tool_name else []),
           "--", sys.executable, "-m", "modulelens", "mcp", "--repo", str(repo)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "npm_config_yes": "true", "npm_config_update_notifier": "false"})


def _json(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout[done.stdout.index("{"):])


def test_the_inspector_cli_lists_calls_and_runs_a_long_tool_as_a_job(tmp_path):
    if shutil.which("npx") is None or shutil.which("node") is None:
        pytest.skip("node/npx is not installed: the MCP Inspector CLI cannot run")
    repo = tmp_path / "repo"
    listed = _inspector(repo, "tools/list")
    if listed.returncode != 0 and ("npm ERR" in listed.stderr or "npm error" in listed.stderr):
        pytest.skip(f"cannot fetch {INSPECTOR} with npx: {listed.stderr.strip().splitlines()[-1]}")
    names = {t["name"] for t in _json(listed)["tools"]}
    assert {"capture_module", "validate_kernel", "list", "start_job", "job_status"} <= names

    cheap = _json(_inspector(repo, "tools/call", "list", kind="captures"))
    assert not cheap["isError"] and cheap["structuredContent"]["captures"] == []

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    arguments = json.dumps({"script": str(script), "module": "0", "name": "lin"})
    started = _json(_inspector(repo, "tools/call", "start_job", tool="capture_module", arguments=arguments))
    assert not started["isError"], started
    job = started["structuredContent"]["job"]
    deadline = time.monotonic() + 300
    while True:
        status = _json(_inspector(repo, "tools/call", "job_status", job=job, wait="40"))["structuredContent"]
        if status["state"] != "running" or time.monotonic() > deadline:
            break
    assert status["state"] == "done", status
    assert status["result"]["ref"] == "lin:v1"
