"""The MCP server as agents use it: a real stdio subprocess driven by mcp.Client."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import mcp
import pytest

pytestmark = pytest.mark.slow


def test_stdio_capture_of_a_printing_script_keeps_the_session_working(tmp_path):
    params = mcp.StdioServerParameters(
        command=sys.executable, args=["-m", "modulelens", "mcp", "--repo", str(tmp_path)],
    )
    script = Path(__file__).parent / "scripts" / "chatty.py"  # writes to stdout in several ways

    async def session():
        async with mcp.Client(params) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert {"capture_module", "replay_module", "list", "show", "export_repro"} <= names
            r = await c.call_tool("capture_module", {"script": str(script), "module": "1", "name": "gated"})
            assert not r.is_error, r.content
            cap = r.structured_content
            assert cap["ref"] == "gated:v1" and "hello from the script" in cap["script_output_tail"]
            # The session still answers, and the capture is usable through it.
            r = await c.call_tool("replay_module", {"ref": "gated", "strategy": "source"})
            assert not r.is_error and r.structured_content["exact"] is True
            r = await c.call_tool("replay_module", {"ref": "nosuch"})
            assert r.is_error and "no capture named 'nosuch'" in r.content[0].text
            res = await c.read_resource("modulelens://captures/gated:v1")
            assert json.loads(res.contents[0].text)["class_path"] == "__main__:Scale"
            r = await c.call_tool("list", {"kind": "captures"})
            assert [x["ref"] for x in r.structured_content["captures"]] == ["gated:v1"]

    anyio.run(session)


def test_script_output_reaches_the_servers_stderr_not_the_wire(tmp_path):
    """What the user's script prints (capture and gather_stats workers) is relayed to the server's
    stderr, as the README says, while the protocol on stdout keeps working."""
    from mcp.client.stdio import stdio_client

    params = mcp.StdioServerParameters(
        command=sys.executable, args=["-m", "modulelens", "mcp", "--repo", str(tmp_path / "repo")],
    )
    chatty = Path(__file__).parent / "scripts" / "chatty.py"
    stats_script = tmp_path / "train_loudly.py"
    stats_script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 4)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(2):\n"
        "    model(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "    print(f'loud training step {step}', flush=True)\n"
    )
    errlog = tmp_path / "server-stderr.txt"

    async def session():
        with errlog.open("w") as err:
            async with mcp.Client(stdio_client(params, errlog=err)) as c:
                r = await c.call_tool("capture_module", {"script": str(chatty), "module": "1", "name": "loud"})
                assert not r.is_error, r.content
                r = await c.call_tool("gather_stats", {"script": str(stats_script), "every": 1, "plots": False})
                assert not r.is_error, r.content
                r = await c.call_tool("list", {"kind": "captures"})
                assert [x["ref"] for x in r.structured_content["captures"]] == ["loud:v1"]

    anyio.run(session)
    text = errlog.read_text()
    assert "hello from the script" in text and "inside forward" in text and "raw write to fd 1" in text
    assert "loud training step 1" in text
