"""Statistics runs as MCP resources (over list and show): modulelens://stats lists
them, modulelens://stats/{ref} shows one."""

from __future__ import annotations

import json

import anyio
import pytest
import torch
import torch.nn as nn
from mcp import Client
from mcp.shared.exceptions import MCPError

from modulelens.mcp_server.server import build_server
from modulelens.stats.collector import StatsCollector
from modulelens.tools import get_tool


def test_stats_runs_are_mcp_resources(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        with StatsCollector(model, every=1, name="run", repo=tmp_path, plots=False):
            for _ in range(2):
                loss = model(torch.randn(3, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    server = build_server([get_tool("list"), get_tool("show")], repo_root=tmp_path)

    async def body():
        async with Client(server) as c:
            listed = [str(r.uri) for r in (await c.list_resources()).resources]
            runs = json.loads((await c.read_resource("modulelens://stats")).contents[0].text)
            one = json.loads((await c.read_resource("modulelens://stats/run:v1")).contents[0].text)
            with pytest.raises(MCPError) as missing:
                await c.read_resource("modulelens://stats/nope")
            return listed, runs, one, missing

    listed, runs, one, missing = anyio.run(body)
    assert "modulelens://stats" in listed
    assert sorted(r["run_id"] for r in runs["runs"]) == ["run:v1", "run:v2"]
    assert one["entry"]["run_id"] == "run:v1" and one["entry"]["modules"] == 4 and one["steps"] == [0, 1]
    assert one["findings"] == [] and [m["name"] for m in one["modules"]] == ["", "0", "1", "2"]
    assert "nope" in str(missing.value)
