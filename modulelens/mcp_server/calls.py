"""Running one tool call for the MCP server: errors as text, the worker thread, progress and
sampling forwarded to the client."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import Context
from pydantic import BaseModel, ValidationError

from modulelens.arguments import argument_errors
from modulelens.errors import ModuleLensError
from modulelens.registry import Tool, ToolContext
from modulelens.repo import default_repo_root

logger = logging.getLogger(__name__)


def error_text(exc: ModuleLensError) -> str:
    """The error as an MCP client reads it: its type and message, then its hint, with arguments
    named as tool arguments (``target``, not ``--target``)."""
    message, hint = exc.rendered("args")
    text = f"{type(exc).__name__}: {message}"
    return f"{text}\nhint: {hint}" if hint else text


def validation_text(exc: ValidationError) -> str:
    """Invalid arguments as an MCP client reads them: one line per field."""
    return "invalid arguments:\n" + "\n".join(argument_errors(exc))


async def call_tool(
    tool: Tool, request: BaseModel, repo_root: Path | None, ctx: Context | None
) -> BaseModel:
    """Run ``tool.fn`` in a worker thread, forwarding its progress to ``ctx``."""
    token = anyio.lowlevel.current_token()

    def progress(
        done: float, total: float | None = None, message: str | None = None
    ) -> None:
        if ctx is None:
            return
        try:
            anyio.from_thread.run(
                ctx.report_progress,
                float(done),
                None if total is None else float(total),
                message,
                token=token,
            )
        except Exception:  # progress must never break a tool
            logger.debug("could not report progress for %s", tool.name, exc_info=True)

    def sample(system: str, user: str, max_tokens: int) -> tuple[str, str]:
        from modulelens.providers.sampling import sample_via_mcp

        return anyio.from_thread.run(sample_via_mcp, ctx, system, user, max_tokens, token=token)

    tool_ctx = ToolContext(
        repo_root=repo_root if repo_root is not None else default_repo_root(),
        progress=progress,
        stdout_is_protocol=True,
        sample=sample if ctx is not None else None,
    )
    return await anyio.to_thread.run_sync(tool.fn, request, tool_ctx)
