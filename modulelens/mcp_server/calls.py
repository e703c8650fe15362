"""Running one tool call for the MCP server: errors as text, the worker thread, progress (with a
heartbeat) and sampling forwarded to the client, and cancellation passed down to the worker
processes."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp_types import InputRequiredResult
from pydantic import BaseModel, ValidationError

from modulelens.arguments import argument_errors
from modulelens.cancellation import cancellable
from modulelens.errors import ModuleLensError
from modulelens.paths import refuse_outside_outputs
from modulelens.registry import Tool, ToolContext
from modulelens.repo import default_repo_root

logger = logging.getLogger(__name__)

HEARTBEAT_S = 2.0  # a progress notification at least this often while a call runs
STOP_WAIT_S = 30.0  # how long a cancelled call waits for its tool to stop its workers


def error_text(exc: ModuleLensError, kind: str | None = None) -> str:
    """The error as an MCP client reads it: its type (or ``kind``, for an error carried over from
    a job process) and message, then its hint, with arguments named as tool arguments (``target``,
    not ``--target``)."""
    message, hint = exc.rendered("args")
    text = f"{kind or type(exc).__name__}: {message}"
    return f"{text}\nhint: {hint}" if hint else text


def validation_text(exc: ValidationError) -> str:
    """Invalid arguments as an MCP client reads them: one line per field."""
    return "invalid arguments:\n" + "\n".join(argument_errors(exc))


class ProgressRelay:
    """Forwards a tool's progress to the MCP client as notifications whose ``progress`` value
    strictly increases (the protocol requires it), and keeps the client informed during long
    phases: :meth:`heartbeat` repeats the last message with the seconds elapsed whenever nothing
    was sent for ``HEARTBEAT_S`` seconds (a compiler, a capture or a statistics run that reports
    nothing for a minute still shows it is alive).

    A heartbeat moves the value a little towards the next whole step (never reaching it), so the
    tool's own next report still increases it."""

    def __init__(self, ctx: Context, started: float):
        self._ctx = ctx
        self._started = started
        self._lock = threading.Lock()
        self._sent = -1.0  # last value sent
        self._base = 0.0  # last value the tool reported
        self._beats = 0
        self._total: float | None = None
        self._message: str | None = None
        self._last_send = started

    def _next(self, done: float | None, total: float | None, message: str | None) -> tuple[float, float | None, str | None]:
        """The value to send for a report (``done`` given) or a heartbeat (None)."""
        with self._lock:
            if done is not None:
                self._total, self._message = total, message if message is not None else self._message
            if done is not None and done > self._sent:
                self._base, self._beats, value = done, 0, done
            else:
                self._beats += 1
                base = max(self._base, 0.0)
                step = 1.0 if self._total is None else min(1.0, self._total - base)
                if step <= 0:
                    step = 1.0
                value = base + 0.99 * step * (1 - 1 / (self._beats + 1))
                if value <= self._sent:  # floating point ran out: move on by a hair
                    value = self._sent + 1e-6
            self._sent = value
            self._last_send = time.monotonic()
            return value, self._total, self._message

    async def send(self, done: float | None, total: float | None, message: str | None) -> None:
        value, total_out, text = self._next(done, total, message)
        if done is None:
            elapsed = time.monotonic() - self._started
            text = f"{text or 'working'} ({elapsed:.0f} s)"
        await self._ctx.report_progress(value, total_out, text)

    async def heartbeat(self) -> None:
        """Send a heartbeat whenever ``HEARTBEAT_S`` seconds passed without a notification; runs
        until cancelled."""
        while True:
            await anyio.sleep(min(HEARTBEAT_S, 1.0))
            if time.monotonic() - self._last_send >= HEARTBEAT_S:
                try:
                    await self.send(None, None, None)
                except Exception:  # progress must never break a tool
                    logger.debug("could not send a heartbeat", exc_info=True)


async def call_tool(
    tool: Tool, request: BaseModel, repo_root: Path | None, ctx: Context | None
) -> BaseModel | InputRequiredResult:
    """Run ``tool.fn`` in a worker thread, forwarding its progress to ``ctx`` (with a heartbeat
    during long silent phases).

    Cancellation (the client's ``notifications/cancelled``) sets ``ToolContext.cancelled``: the
    worker processes the tool started are killed (see :mod:`modulelens.cancellation`), and the
    call waits up to ``STOP_WAIT_S`` seconds for the tool to leave the repository consistent before
    it ends. A tool that needs a sample the client has not given yet (protocol 2026-07-28) ends
    the call with an ``InputRequiredResult``; the client retries with the reply."""
    from modulelens.providers.sampling import SamplingInputRequired, thread_sampler

    token = anyio.lowlevel.current_token()
    relay = ProgressRelay(ctx, time.monotonic()) if ctx is not None else None

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        if relay is None:
            return
        try:
            anyio.from_thread.run(relay.send, float(done), None if total is None else float(total), message,
                                  token=token)
        except Exception:  # progress must never break a tool
            logger.debug("could not report progress for %s", tool.name, exc_info=True)

    tool_ctx = ToolContext(
        repo_root=repo_root if repo_root is not None else default_repo_root(),
        progress=progress,
        stdout_is_protocol=True,
        sample=thread_sampler(ctx) if ctx is not None else None,
    )
    refuse_outside_outputs(request.model_dump(), tool_ctx.project, tool_ctx.repo_root)  # before anything runs
    try:
        return await run_cancellable(tool, request, tool_ctx, relay)
    except SamplingInputRequired as need:
        return InputRequiredResult(input_requests={need.key: need.request}, request_state=need.state)


async def run_cancellable(tool: Tool, request: BaseModel, tool_ctx: ToolContext,
                          relay: ProgressRelay | None = None) -> BaseModel:
    """``tool.fn(request, tool_ctx)`` in a worker thread inside :func:`cancellable`; when this
    coroutine is cancelled, set ``tool_ctx.cancelled`` and wait (shielded, up to ``STOP_WAIT_S``)
    for the thread to stop its workers before the cancellation goes on."""
    finished = threading.Event()

    def run() -> BaseModel:
        try:
            with cancellable(tool_ctx.cancelled):
                return tool.fn(request, tool_ctx)
        finally:
            finished.set()

    failure: list[BaseException] = []
    result: list[BaseModel] = []
    async with anyio.create_task_group() as heartbeats:
        if relay is not None:
            heartbeats.start_soon(relay.heartbeat)
        try:
            result.append(await anyio.to_thread.run_sync(run, abandon_on_cancel=True))
        except anyio.get_cancelled_exc_class():
            tool_ctx.cancelled.set()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(finished.wait, STOP_WAIT_S)
            raise
        except BaseException as exc:  # noqa: BLE001 - re-raised below, outside the task group
            failure.append(exc)
        finally:
            heartbeats.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return result[0]
