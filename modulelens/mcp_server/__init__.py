"""The MCP server, generated from the tool registry (see :mod:`modulelens.mcp_server.server`)."""

from __future__ import annotations

from modulelens.mcp_server.server import build_server, run_stdio

__all__ = ["build_server", "run_stdio"]
