"""The ``sampling`` provider: the MCP client's own model writes the kernel, or a module's
``ModelNew`` (MCP sampling).

The tool runs in a worker thread; the MCP server puts a blocking ``sample(system, user,
max_tokens) -> (reply text, model name)`` on the :class:`~modulelens.registry.ToolContext`, built
with :func:`thread_sampler` from the tool call's MCP ``Context``. Outside an MCP server (the CLI),
or for a client that did not declare the sampling capability, there is no such function and the
provider says so.

On connections that negotiated protocol 2025-11-25 or older (the ``initialize`` handshake),
sampling is a server-to-client request in the middle of the tool call. On 2026-07-28 and newer it
is the two-phase flow (SEP-2322): the call ends with an ``InputRequiredResult`` asking for the
sample, the client asks its model and calls the tool again with the reply in ``input_responses``,
and the tool, run again from the start, finds the reply to its (identical) prompt there. Replies
of earlier rounds ride ``request_state``, so a tool that samples several times asks each prompt
once.
"""

from __future__ import annotations

import warnings
from typing import Any

from modulelens.callbacks import SampleFn
from modulelens.errors import ModuleLensError
from modulelens.kernels.module_candidates import ModuleCandidate
from modulelens.kernels.source import KernelSource
from modulelens.providers.module_prompting import MODULE_LANGUAGE, build_module_messages
from modulelens.providers.module_request import ModuleRequest, module_lineage
from modulelens.providers.prompting import build_messages, extract_code, prompt_sha256
from modulelens.providers.request import GenerationRequest, lineage

DEFAULT_MAX_TOKENS = 16000
INPUT_REQUIRED_VERSION = "2026-07-28"  # first protocol whose tools/call samples through InputRequiredResult

UNAVAILABLE = (
    "MCP sampling is only available when modulelens runs as an MCP server for a client that supports sampling"
)
UNAVAILABLE_HINT = (
    "use [--provider template] (offline) or [--provider anthropic] (needs ANTHROPIC_API_KEY), or write the kernel "
    "yourself and pass it to validate_kernel"
)

class SamplingProvider:
    name = "sampling"

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS):
        self.max_tokens = max_tokens

    def generate(self, req: GenerationRequest, ctx: Any) -> KernelSource:
        system, user = build_messages(req)
        code, provenance = self._write(system, user, req.backend, ctx)
        provenance.update(variant=req.variant, **lineage(req))
        return KernelSource(backend=req.backend, source=code, provider=self.name,
                            params={"variant": req.variant}, provenance=provenance)

    def generate_module(self, req: ModuleRequest, ctx: Any) -> ModuleCandidate:
        """A ``ModelNew`` for the captured module ``req`` describes, from the client's model."""
        system, user = build_module_messages(req)
        code, provenance = self._write(system, user, MODULE_LANGUAGE, ctx)
        provenance.update(variant=req.variant, **module_lineage(req))
        return ModuleCandidate(source=code, claims_training=req.training, provider=self.name, provenance=provenance)

    def _write(self, system: str, user: str, language: str, ctx: Any) -> tuple[str, dict[str, Any]]:
        """(the code of the client model's reply to the prompt, its provenance)."""
        sample: SampleFn | None = getattr(ctx, "sample", None)
        if sample is None:
            raise ModuleLensError(UNAVAILABLE, UNAVAILABLE_HINT)
        text, model = sample(system, user, self.max_tokens)
        return extract_code(text, language), {
            "provider": self.name,
            "model": model,
            "prompt_sha256": prompt_sha256(system, user),
            "max_tokens": self.max_tokens,
            "input_tokens": None,  # MCP sampling reports neither tokens nor cost
            "output_tokens": None,
            "cost_usd": None,
        }


class SamplingInputRequired(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Raised (from the tool's thread) on a protocol 2026-07-28 connection when the tool needs a
    sample the client has not given yet: the MCP server answers the call with an
    ``InputRequiredResult`` carrying ``request`` under ``key``, and the client retries the call with
    the reply. A BaseException so that no ``except Exception`` in a tool swallows it."""

    def __init__(self, key: str, request: Any, state: str):
        super().__init__(key)
        self.key, self.request, self.state = key, request, state


def uses_input_required(protocol_version: str | None) -> bool:
    """True when the connection's protocol (2026-07-28 or newer) carries sampling through
    ``InputRequiredResult`` instead of a server-to-client request in the middle of the call."""
    from mcp_types.version import is_version_at_least

    return protocol_version is not None and is_version_at_least(protocol_version, INPUT_REQUIRED_VERSION)


def _sample_key(system: str, user: str, max_tokens: int) -> str:
    return "sample-" + prompt_sha256(system, f"{max_tokens}\n{user}")[:24]


def _answered(ctx: Any) -> dict[str, Any]:
    """The sampling replies of the earlier rounds of this call (carried in ``request_state``) and
    of the last one (``input_responses``), by key."""
    import json

    answers: dict[str, Any] = {}
    if ctx.request_state:
        try:
            answers.update(json.loads(ctx.request_state))
        except (ValueError, TypeError):
            pass
    for key, response in (ctx.input_responses or {}).items():
        answers[key] = response.model_dump(mode="json", by_alias=True) if hasattr(response, "model_dump") else response
    return answers


def _reply_text(result: Any) -> tuple[str, str]:
    """(text, model) of a sampling reply; a ModuleLensError when it holds no text."""
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


def sample_from_input_responses(ctx: Any, system: str, user: str, max_tokens: int) -> tuple[str, str]:
    """Protocol 2026-07-28: the reply to this prompt if the client already gave it (this round or
    an earlier one), else :class:`SamplingInputRequired` asking for it. Callable from any thread."""
    import json

    import mcp.types as types

    _require_sampling(ctx)
    answers = _answered(ctx)
    key = _sample_key(system, user, max_tokens)
    if key not in answers:
        request = types.CreateMessageRequest(params=types.CreateMessageRequestParams(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=user))],
            max_tokens=max_tokens, system_prompt=system,
        ))
        raise SamplingInputRequired(key, request, json.dumps(answers))
    answer = answers[key]
    if isinstance(answer, dict) and "code" in answer and "message" in answer and "role" not in answer:
        raise ModuleLensError(f"the MCP client did not answer the sampling request: {answer['message']}",
                              "allow sampling in the client, or " + UNAVAILABLE_HINT)
    try:
        result = types.CreateMessageResult.model_validate(answer)
    except ValueError:
        result = types.CreateMessageResultWithTools.model_validate(answer)
    return _reply_text(result)


def _require_sampling(ctx: Any) -> None:
    caps = ctx.client_capabilities
    if caps is None or caps.sampling is None:
        raise ModuleLensError(UNAVAILABLE + " (this client did not declare the sampling capability)", UNAVAILABLE_HINT)


async def sample_via_mcp(ctx: Any, system: str, user: str, max_tokens: int) -> tuple[str, str]:
    """Ask the connected client's model through MCP sampling (``sampling/createMessage``).

    ``ctx`` is the ``mcp.server.mcpserver.Context`` of the running tool call. Returns (reply
    text, model name as the client reports it). On protocol 2025-11-25 or older the request goes to
    the client in the middle of the call; on 2026-07-28 or newer it goes through
    :func:`sample_from_input_responses` (:class:`SamplingInputRequired` when not answered yet).
    Raises ModuleLensError when the client did not declare sampling, when the client refuses, or
    when the reply is not text.
    """
    import mcp.types as types
    from mcp.shared.exceptions import MCPDeprecationWarning, MCPError, NoBackChannelError

    if uses_input_required(ctx.protocol_version):
        return sample_from_input_responses(ctx, system, user, max_tokens)
    _require_sampling(ctx)
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
    return _reply_text(result)


def thread_sampler(ctx: Any) -> SampleFn:
    """A blocking ``sample(system, user, max_tokens)`` for a tool running in a worker thread
    started by ``anyio.to_thread.run_sync`` from the tool call whose MCP ``Context`` is ``ctx``.
    On protocol 2026-07-28 it may raise :class:`SamplingInputRequired` (see
    :func:`sample_via_mcp`), which the MCP server turns into an ``InputRequiredResult``."""
    import anyio.from_thread

    def sample(system: str, user: str, max_tokens: int) -> tuple[str, str]:
        if uses_input_required(ctx.protocol_version):
            return sample_from_input_responses(ctx, system, user, max_tokens)
        return anyio.from_thread.run(sample_via_mcp, ctx, system, user, max_tokens)

    return sample
