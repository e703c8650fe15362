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
            assert {"capture_module", "replay_module", "list_captures", "show_capture", "export_repro"} <= names
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
            r = await c.call_tool("list_captures", {})
            assert [x["ref"] for x in r.structured_content["captures"]] == ["gated:v1"]

    anyio.run(session)
