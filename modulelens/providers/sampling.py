"""The ``sampling`` provider: the MCP client's own model writes the kernel (MCP sampling).

The tool runs in a worker thread; the MCP server puts a blocking ``sample(system, user,
max_tokens) -> (reply text, model name)`` on the :class:`~modulelens.registry.ToolContext`, built
with :func:`thread_sampler` from the tool call's MCP ``Context``. Outside an MCP server (the CLI),
or for a client that did not declare the sampling capability, there is no such function and the
provider says so.

MCP sampling is a server-to-client request in the middle of a tool call, which only connections
that negotiated protocol 2025-11-25 or older (the ``initialize`` handshake) can carry; newer
connections (2026-07-28, SEP-2577, where sampling is deprecated) answer with an error that
:func:`sample_via_mcp` turns into a ModuleLensError with a hint.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from modulelens.errors import ModuleLensError
from modulelens.kernels.source import KernelSource
from modulelens.providers.prompting import build_messages, extract_code, prompt_sha256
from modulelens.providers.request import GenerationRequest, lineage

DEFAULT_MAX_TOKENS = 16000

UNAVAILABLE = (
    "MCP sampling is only available when modulelens runs as an MCP server for a client that supports sampling"
)
UNAVAILABLE_HINT = (
    "use [--provider template] (offline) or [--provider anthropic] (needs ANTHROPIC_API_KEY), or write the kernel "
    "yourself and pass it to validate_kernel"
)

SampleFn = Callable[[str, str, int], tuple[str, str]]


class SamplingProvider:
    name = "sampling"

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS):
        self.max_tokens = max_tokens

    def generate(self, req: GenerationRequest, ctx: Any) -> KernelSource:
        sample: SampleFn | None = getattr(ctx, "sample", None)
        if sample is None:
            raise ModuleLensError(UNAVAILABLE, UNAVAILABLE_HINT)
        system, user = build_messages(req)
        text, model = sample(system, user, self.max_tokens)
        code = extract_code(text, req.backend)
        provenance = {
            "provider": self.name,
            "model": model,
            "prompt_sha256": prompt_sha256(system, user),
            "max_tokens": self.max_tokens,
            "input_tokens": None,  # MCP sampling reports neither tokens nor cost
            "output_tokens": None,
            "cost_usd": None,
            "variant": req.variant,
            **lineage(req),
        }
        return KernelSource(backend=req.backend, source=code, provider=self.name,
                            params={"variant": req.variant}, provenance=provenance)


async def sample_via_mcp(ctx: Any, system: str, user: str, max_tokens: int) -> tuple[str, str]:
    """Ask the connected client's model through MCP sampling (``sampling/createMessage``).

    ``ctx`` is the ``mcp.server.mcpserver.Context`` of the running tool call. Returns (reply
    text, model name as the client reports it). Raises ModuleLensError when the client did not
    declare sampling, when the connection cannot carry a server-to-client request, when the client
    refuses, or when the reply is not text.
    """
    import mcp.types as types
    from mcp.shared.exceptions import MCPDeprecationWarning, MCPError, NoBackChannelError

    caps = ctx.client_capabilities
    if caps is None or caps.sampling is None:
        raise ModuleLensError(UNAVAILABLE + " (this client did not declare the sampling capability)", UNAVAILABLE_HINT)
    messages = [types.SamplingMessage(role="user", content=types.TextContent(type="text", text=user))]
    with warnings.catch_warnings():  # the call warns that sampling is deprecated as of 2026-07-28
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        pending = ctx.session.create_message(
            messages,
            max_tokens=max_tokens,
            system_prompt=system,
            related_request_id=ctx.request_context.request_id,
        )
    try:
        result = await pending
    except NoBackChannelError:
        raise ModuleLensError(
            f"{UNAVAILABLE}: this connection (MCP protocol {ctx.protocol_version}) cannot carry a sampling request "
            "in the middle of a tool call",
            "connect with protocol 2025-11-25 or older (the initialize handshake), or " + UNAVAILABLE_HINT,
        )
    except MCPError as e:
        raise ModuleLensError(f"the MCP client did not answer the sampling request: {e}",
                              "allow sampling in the client, or " + UNAVAILABLE_HINT)
    content = result.content
    if isinstance(content, list):  # CreateMessageResultWithTools allows several blocks
        texts = [c.text for c in content if getattr(c, "type", None) == "text"]
    else:
        texts = [content.text] if getattr(content, "type", None) == "text" else []
    if not texts:
        kinds = sorted({getattr(c, "type", "?") for c in (content if isinstance(content, list) else [content])})
        raise ModuleLensError(f"the client's model replied with {', '.join(kinds)} content instead of text",
                              "try again, or " + UNAVAILABLE_HINT)
    return "".join(texts), result.model


def thread_sampler(ctx: Any) -> SampleFn:
    """A blocking ``sample(system, user, max_tokens)`` for a tool running in a worker thread
    started by ``anyio.to_thread.run_sync`` from the tool call whose MCP ``Context`` is ``ctx``."""
    import anyio.from_thread

    def sample(system: str, user: str, max_tokens: int) -> tuple[str, str]:
        return anyio.from_thread.run(sample_via_mcp, ctx, system, user, max_tokens)

    return sample
