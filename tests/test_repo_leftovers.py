"""What killed or failed writes leave, and inputs refused at the door: temporary folders of killed
captures go at the start of any tool (not only at the next write); a full disk while writing an
artifact is one line naming the repository and what to free, whatever library raised; negative
tolerances are refused by the CLI as by MCP."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import mcp
import pytest

from modulelens.repo import this_process
from modulelens.sandbox.containment import namespace_prefix
from modulelens.tools import all_tools
from tests.conftest import ROOT


def test_temporary_folders_of_killed_writers_go_at_the_start_of_any_tool(cli, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tmp = tmp_path / ".tmp"
    killed = tmp / f"{dead.pid}.1~captures-blk-abc"
    running = tmp / f"{this_process()}~captures-blk-def"
    for folder in (killed, running):
        (folder / "deep" / "er").mkdir(parents=True)
        (folder / "deep" / "er" / "inputs.safetensors").write_bytes(b"\0" * 4096)
    code, data, result = cli("list", "captures", "--repo", str(tmp_path), "--json")  # reads only
    assert code == 0, result.output
    assert not killed.exists() and running.exists()


@pytest.mark.skipif("--user" not in namespace_prefix()[0], reason="needs user and mount namespaces to make a small disk")
def test_a_full_disk_while_capturing_is_one_line_naming_the_repository(tmp_path):
    repo = tmp_path / "small"
    repo.mkdir()
    script = (f"mount -t tmpfs -o size=64k tmpfs {repo} && cd {tmp_path} && "
              f"{sys.executable} -m modulelens capture-module {ROOT / 'examples/kernelbench/layernorm_gelu.py'} "
              f"--name lg --quiet; echo rc=$?; ls -A {repo}/.tmp")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MODULELENS_HOME": str(repo), "OMP_NUM_THREADS": "1"})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: no space left on the device holding the repository {repo} while writing captures lg"], \
        done.stderr[-3000:]
    assert "hint: free space there" in done.stderr and "Traceback" not in done.stderr
    assert "rc=2" in done.stdout and done.stdout.strip().endswith("rc=2"), done.stdout  # nothing left in .tmp


def test_every_tolerance_refuses_negative_values_in_the_cli_and_over_mcp(cli, tmp_path):
    for tool in all_tools():
        for name in ("rtol", "atol"):
            field = tool.request.model_fields.get(name)
            if field is not None:
                assert any(getattr(m, "ge", None) == 0 for m in field.metadata), f"{tool.name}.{name} admits < 0"
    code, data, result = cli("replay-module", "enc0", "--rtol", "-1", "--repo", str(tmp_path), "--json")
    assert code == 2 and data["type"] == "ValidationError" and "--rtol" in data["error"], result.output

    from modulelens.mcp_server.server import build_server

    async def call():
        async with mcp.Client(build_server(all_tools(), repo_root=tmp_path)) as c:
            return await c.call_tool("replay_module", {"ref": "enc0", "atol": -1})

    res = anyio.run(call)
    assert res.is_error and "atol" in res.content[0].text
