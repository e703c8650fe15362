"""Kernel source providers: prompts, code extraction, the Anthropic client against a fake wire,
the template adapter, and MCP sampling through a real in-process mcp.Client round trip."""

from __future__ import annotations

import json
import random
import types as pytypes
import warnings

import pytest
import torch
from mcp.server.mcpserver import Context, MCPServer  # module level: tool annotations are resolved by name

from modulelens.errors import ModuleLensError
from modulelens.kernels import KernelSource
from modulelens.providers.base import GenerationRequest, build_messages, extract_code, get_provider

CPP_REPLY = """Here is a fused kernel.

```cpp
#include <torch/extension.h>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(torch::Tensor input_, std::vector<int64_t> shape,
    c10::optional<torch::Tensor> weight, c10::optional<torch::Tensor> bias, double eps) {
  return {};
}
```

It reads each row once."""


def _card(op: str = "aten.native_layer_norm.default") -> dict:
    """A card as capture_ops stores it, with a sample encoded by the real Encoder."""
    from modulelens.capture import Encoder, TensorSink

    x, w, b = torch.randn(8, 32, 64), torch.randn(64), torch.randn(64)
    args = [x, [64], w, b, 1e-5]
    out = torch.ops.aten.native_layer_norm.default(*args)
    enc = Encoder(TensorSink())
    sample = {"args": enc.encode(args, "args"), "kwargs": enc.encode({}, "kwargs"), "output": enc.encode(out, "output")}
    return {
        "index": 0, "card_id": "blk/0", "op": op, "kind": "memory", "phase": "forward",
        "shapes": [[8, 32, 64], [64], [64]], "dtypes": ["float32"] * 3, "strides": [[2048, 64, 1], [1], [1]],
        "contiguous": [True] * 3, "device": "cpu", "args": [64, 1e-5], "calls": 2, "time_s": 1e-4,
        "time_share": 0.123, "bytes_per_call": 131584, "uninitialised_output": False, "samples": [sample],
    }


@pytest.fixture
def card():
    return _card()


# --- the request ------------------------------------------------------------------------------


def test_a_generation_request_holds_the_card_itself(card):
    """Built once: a card's stored JSON validates into an OpCard when the request is made (a bad
    card fails there, not inside a provider), and a card read from its opset is kept as it is."""
    from pydantic import ValidationError

    from modulelens.ops import OpCard

    req = GenerationRequest(card=card, backend="cpp")
    assert isinstance(req.card, OpCard) and (req.card.op, req.card.shapes) == (card["op"], card["shapes"])
    stored = OpCard.model_validate(card).bind("blk:v1")
    assert GenerationRequest(card=stored, backend="cpp").card.card_id == "blk:v1/0"
    with pytest.raises(ValidationError, match="card.op"):
        GenerationRequest(card={"shapes": [[8, 32]]}, backend="cpp")


# --- extract_code -----------------------------------------------------------------------------


def test_extract_code_takes_the_block_out_of_prose():
    code = extract_code(CPP_REPLY, "cpp")
    assert code.startswith("#include <torch/extension.h>") and code.rstrip().endswith("}")
    assert "Here is" not in code and "```" not in code


def test_extract_code_prefers_the_backend_language_then_the_largest():
    big_py = "```python\n" + "x = 1\n" * 50 + "```"
    reply = f"usage:\n{big_py}\nkernel:\n```c++\nint forward();\n```\nand\n```cpp\nint forward() {{ return 0; }}\n```"
    assert extract_code(reply, "cpp") == "int forward() { return 0; }\n"  # largest matching, not the python
    assert extract_code(reply, "triton").startswith("x = 1")
    assert extract_code("```cuda\n__global__ void k() {}\n```\n```cpp\nint a;\n```", "cuda").startswith("__global__")
    assert extract_code("```cpp\nint forward();\n```", "cuda") == "int forward();\n"  # CUDA written as cpp
    # No language tag anywhere: the largest block.
    assert extract_code("```\na\n```\n```\nbbbb\n```", "triton") == "bbbb\n"
    # Tilde fences and longer fences with nested backticks.
    assert extract_code("~~~python\nprint\n~~~", "triton") == "print\n"
    assert extract_code("````python\ns = '```'\n````", "triton") == "s = '```'\n"


@pytest.mark.parametrize("reply", ["I cannot do that.", "", "```cpp\nint x; // cut off at max_tokens", "```\n\n```"])
def test_extract_code_without_a_complete_block_is_a_clear_error(reply):
    with pytest.raises(ModuleLensError) as e:
        extract_code(reply, "cpp")
    assert e.value.message == "the model's reply contained no code block"
    assert repr(reply.strip()[:200]) in e.value.hint if reply.strip() else "empty" in e.value.hint


def test_extract_code_error_quotes_at_most_200_characters():
    with pytest.raises(ModuleLensError) as e:
        extract_code("A" * 1000, "cpp")
    assert "A" * 200 in e.value.hint and "A" * 201 not in e.value.hint


# --- prompts ----------------------------------------------------------------------------------


def test_generate_prompt_states_the_card_and_the_exact_arguments(card):
    system, user = build_messages(GenerationRequest(card=card, backend="cpp", instructions="Use OpenMP."))
    assert "forward" in system and "wrapper" in system and "adversarial" in system and "print" in system
    assert "exactly one fenced code block (```cpp)" in system
    assert "c10::optional<torch::Tensor>" in system  # the contract from KernelSource's docstring
    assert "aten.native_layer_norm.default" in user and "[8, 32, 64]" in user and "float32" in user
    assert "[2048, 64, 1]" in user and "12.3%" in user
    assert "exactly these 5 positional arguments" in user
    for line in ("0. `input`: Tensor, shape [8, 32, 64], float32", "1. `normalized_shape`: list of int = [64]",
                 "2. `weight`: Tensor, shape [64]", "4. `eps`: float = 1e-05; declare as `double`"):
        assert line in user, line
    assert "a tuple of 3 tensors" in user and "std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(" in user
    assert "torch::Tensor input," in user
    assert "Use OpenMP." in user
    assert "{" not in user.replace("{}", "")  # every placeholder filled


def test_triton_prompt_uses_python_types(card):
    system, user = build_messages(GenerationRequest(card=card, backend="triton", variant=2))
    assert "```python" in system and "@triton.jit" in system
    assert "def forward(input: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor" in user
    assert "variant 2" in user


def test_none_argument_takes_its_optional_type_from_the_schema(card):
    from modulelens.capture import Encoder, TensorSink

    card["samples"][0]["args"] = Encoder(TensorSink()).encode([torch.randn(8, 32, 64), [64], None, None, 1e-5], "a")
    _, user = build_messages(GenerationRequest(card=card, backend="cuda"))
    assert "2. `weight`: None; declare as `c10::optional<torch::Tensor>`" in user


def test_arguments_of_lists_of_tensors_and_keyword_values():
    from modulelens.capture import Encoder, TensorSink
    from modulelens.providers.base import describe_arguments

    enc = Encoder(TensorSink())
    x = torch.randn(4, 8).t()
    card = {"op": "aten.sum.dim_IntList", "samples": [{"args": enc.encode([x, [1], True], "args"),
                                                       "kwargs": enc.encode({"dtype": torch.float64}, "kwargs")}]}
    args = describe_arguments(card, "cpp")
    assert [a["name"] for a in args] == ["self", "dim", "keepdim", "dtype"]
    assert "strides [1, 8] (non-contiguous)" in args[0]["text"]
    assert [a["cpp"] for a in args] == ["torch::Tensor", "std::vector<int64_t>", "bool", "at::ScalarType"]
    assert args[3]["keyword"] == "dtype"

    card = {"op": "aten.cat.default", "samples": [{"args": enc.encode([[torch.ones(2, 3), torch.ones(2, 5)], 1], "a"),
                                                   "kwargs": enc.encode({}, "k")}]}
    args = describe_arguments(card, "triton")
    assert args[0]["python"] == "list[torch.Tensor]" and "list of 2 tensors" in args[0]["text"]
    assert args[1]["cpp"] == "int64_t" and args[1]["text"] == "int = 1"


def test_repair_prompt_carries_the_parent_and_its_report(card):
    parent = KernelSource(backend="cpp", source="int forward() { return BROKEN; }", provider="anthropic")
    report = {"verdict": "rejected", "correct": False, "reason": "does not compile",
              "errors": ["error: 'BROKEN' was not declared in this scope"], "speedup_vs_eager": None}
    system, user = build_messages(GenerationRequest(card=card, backend="cpp", parent=parent, parent_report=report))
    assert "int forward() { return BROKEN; }" in user
    assert "'BROKEN' was not declared in this scope" in user and "verdict: rejected" in user
    assert "does not compile" in user and "Fix" in user
    assert "aten.native_layer_norm.default" in user

    fast = {"verdict": "custom", "correct": True, "speedup_vs_eager": 1.4, "timing": {"median_s": 1e-5}}
    _, user = build_messages(GenerationRequest(card=card, backend="cpp", parent=parent, parent_report=fast))
    assert "faster" in user and "1.4x" in user and "median_s" in user

    # A parent without a report is not a repair.
    _, user = build_messages(GenerationRequest(card=card, backend="cpp", parent=parent))
    assert "BROKEN" not in user


def test_render_reports_a_missing_field():
    from modulelens.prompts import render

    with pytest.raises(ModuleLensError, match=r"generate_kernel.md uses \{backend_title\} but no value"):
        render("generate_kernel", backend="cpp")


def test_prompt_files_ship_with_the_package():
    from importlib import resources

    names = {p.name for p in resources.files("modulelens.prompts").iterdir()}
    assert {"system.md", "generate_kernel.md", "repair_kernel.md"} <= names


def test_get_provider():
    assert get_provider("template").name == "template"
    assert get_provider("anthropic").name == "anthropic"
    assert get_provider("sampling").name == "sampling"
    with pytest.raises(ModuleLensError) as e:
        get_provider("openai")
    assert "template, anthropic, sampling" in e.value.hint


# --- anthropic --------------------------------------------------------------------------------


class FakeTransport:
    """Answers with the queued (status, headers, body) responses and records each request."""

    def __init__(self, *responses):
        self.responses = list(responses)
        self.calls = []

    def post(self, url, headers, body, timeout):
        self.calls.append({"url": url, "headers": headers, "body": json.loads(body), "timeout": timeout})
        r = self.responses.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


def ok(text=CPP_REPLY, model="claude-sonnet-4-5-20250929", tokens=(1200, 800)):
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "stop_reason": "end_turn",
            "content": [{"type": "text", "text": text}],
            "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]}}
    return 200, {"Request-Id": "req_abc", "content-type": "application/json"}, json.dumps(body).encode()


def err(status, message, kind="error", headers=None):
    return status, headers or {}, json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


@pytest.fixture
def env(monkeypatch):
    for name in ("ANTHROPIC_BASE_URL", "MODULELENS_ANTHROPIC_MODEL", "MODULELENS_PRICE_IN", "MODULELENS_PRICE_OUT",
                 "MODULELENS_ANTHROPIC_MAX_TOKENS", "MODULELENS_ANTHROPIC_MAX_ATTEMPTS", "MODULELENS_ANTHROPIC_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-a-real-key")
    return monkeypatch


def provider(transport, sleeps=None, **kw):
    from modulelens.providers.anthropic import AnthropicProvider

    return AnthropicProvider(transport, sleep=(sleeps.append if sleeps is not None else (lambda s: None)), rng=random.Random(0),
                             **kw)


def test_anthropic_request_shape_and_result(env, card):
    from modulelens.providers.anthropic import DEFAULT_MODEL

    t = FakeTransport(ok())
    ks = provider(t).generate(GenerationRequest(card=card, backend="cpp"), None)
    assert len(t.calls) == 1
    call = t.calls[0]
    assert call["url"] == "https://api.anthropic.com/v1/messages"
    assert call["headers"] == {"x-api-key": "sk-test-not-a-real-key", "anthropic-version": "2023-06-01",
                               "content-type": "application/json"}
    body = call["body"]
    assert set(body) == {"model", "max_tokens", "system", "messages", "temperature"}
    assert body["model"] == DEFAULT_MODEL and body["max_tokens"] > 1000
    assert body["messages"][0]["role"] == "user" and len(body["messages"]) == 1
    user = body["messages"][0]["content"]
    assert "aten.native_layer_norm.default" in user and "[8, 32, 64]" in user
    assert "candidate" in body["system"].lower()

    assert ks.backend == "cpp" and ks.provider == "anthropic" and ks.entry == "forward"
    assert ks.source.startswith("#include <torch/extension.h>") and "It reads" not in ks.source
    p = ks.provenance
    assert p["model"] == "claude-sonnet-4-5-20250929" and p["requested_model"] == DEFAULT_MODEL
    assert p["input_tokens"] == 1200 and p["output_tokens"] == 800
    assert p["cost_usd"] == pytest.approx((1200 * 3 + 800 * 15) / 1e6) and p["cost_is_estimate"] is True
    assert p["attempts"] == 1 and p["stop_reason"] == "end_turn" and p["request_id"] == "req_abc"
    assert len(p["prompt_sha256"]) == 64


def test_anthropic_settings_from_the_environment(env, card):
    env.setenv("ANTHROPIC_BASE_URL", "http://localhost:9999/")
    env.setenv("MODULELENS_ANTHROPIC_MODEL", "claude-opus-4-1")
    env.setenv("MODULELENS_ANTHROPIC_MAX_TOKENS", "1234")
    env.setenv("MODULELENS_PRICE_IN", "2")
    env.setenv("MODULELENS_PRICE_OUT", "10")
    t = FakeTransport(ok(model="claude-opus-4-1", tokens=(1_000_000, 100_000)))
    ks = provider(t).generate(GenerationRequest(card=card, backend="cpp"), None)
    assert t.calls[0]["url"] == "http://localhost:9999/v1/messages"
    assert t.calls[0]["body"]["model"] == "claude-opus-4-1" and t.calls[0]["body"]["max_tokens"] == 1234
    assert ks.provenance["cost_usd"] == pytest.approx(3.0)
    assert ks.provenance["price_per_mtok"] == {"input": 2.0, "output": 10.0, "source": "env"}


def test_anthropic_unknown_model_has_no_cost(env, card):
    t = FakeTransport(ok(model="some-future-model"))
    ks = provider(t, model="some-future-model").generate(GenerationRequest(card=card, backend="cpp"), None)
    assert t.calls[0]["body"]["model"] == "some-future-model"
    assert ks.provenance["cost_usd"] is None and ks.provenance["input_tokens"] == 1200


def test_anthropic_missing_key_fails_before_any_request(env, card):
    env.delenv("ANTHROPIC_API_KEY")
    t = FakeTransport(ok())
    with pytest.raises(ModuleLensError) as e:
        provider(t).generate(GenerationRequest(card=card, backend="cpp"), None)
    assert e.value.message == "ANTHROPIC_API_KEY is not set"
    assert "--provider template" in e.value.hint and "sampling" in e.value.hint
    assert t.calls == []


def test_anthropic_retries_429_honouring_retry_after(env, card):
    sleeps = []
    t = FakeTransport(err(429, "rate limited", "rate_limit_error", {"retry-after": "7"}),
                      err(429, "rate limited", "rate_limit_error", {"Retry-After": "2"}), ok())
    ks = provider(t, sleeps).generate(GenerationRequest(card=card, backend="cpp"), None)
    assert sleeps == [7.0, 2.0]
    assert len(t.calls) == 3 and ks.provenance["attempts"] == 3
    assert t.calls[0]["body"] == t.calls[2]["body"]


def test_anthropic_retries_5xx_with_backoff(env, card):
    sleeps = []
    t = FakeTransport(err(500, "internal", "api_error"), err(529, "overloaded", "overloaded_error"),
                      OSError("connection reset"), ok())
    ks = provider(t, sleeps).generate(GenerationRequest(card=card, backend="cpp"), None)
    assert ks.provenance["attempts"] == 4 and len(sleeps) == 3
    for attempt, s in enumerate(sleeps, start=1):  # exponential with jitter in [50%, 100%]
        assert 0.5 * 2 ** (attempt - 1) <= s <= 2 ** (attempt - 1)


def test_anthropic_gives_up_after_max_attempts(env, card):
    sleeps = []
    t = FakeTransport(*[err(529, "Overloaded", "overloaded_error")] * 3)
    with pytest.raises(ModuleLensError) as e:
        provider(t, sleeps, max_attempts=3).generate(GenerationRequest(card=card, backend="cpp"), None)
    assert "after 3 attempt(s)" in e.value.message and "Overloaded" in e.value.message
    assert len(t.calls) == 3 and len(sleeps) == 2


def test_anthropic_client_error_is_not_retried(env, card):
    sleeps = []
    t = FakeTransport(err(400, "max_tokens: 99999999 > 64000, which is the maximum", "invalid_request_error"))
    with pytest.raises(ModuleLensError) as e:
        provider(t, sleeps).generate(GenerationRequest(card=card, backend="cpp"), None)
    assert "invalid_request_error: max_tokens: 99999999 > 64000" in e.value.message and "HTTP 400" in e.value.message
    assert len(t.calls) == 1 and sleeps == []
    assert "sk-test" not in str(e.value)

    t = FakeTransport(err(401, "invalid x-api-key", "authentication_error"))
    with pytest.raises(ModuleLensError) as e:
        provider(t, sleeps).generate(GenerationRequest(card=card, backend="cpp"), None)
    assert "invalid x-api-key" in e.value.message and "ANTHROPIC_API_KEY" in e.value.hint


def test_anthropic_reply_without_code(env, card):
    t = FakeTransport(ok(text="I am not able to write that kernel."))
    with pytest.raises(ModuleLensError, match="no code block") as e:
        provider(t).generate(GenerationRequest(card=card, backend="cpp"), None)
    assert "not able" in e.value.hint


def test_anthropic_repair_records_lineage(env, card):
    parent = KernelSource(backend="cpp", source="int forward();", provider="template", params={"variant": 1})
    t = FakeTransport(ok())
    ks = provider(t).generate(GenerationRequest(card=card, backend="cpp", parent=parent,
                                                parent_report={"verdict": "rejected", "errors": ["E42 boom"]}), None)
    assert "E42 boom" in t.calls[0]["body"]["messages"][0]["content"]
    assert ks.provenance["parent"] == parent.sha256 and ks.provenance["parent_verdict"] == "rejected"


def test_urllib_transport_returns_http_errors(monkeypatch):
    import io
    import urllib.error

    from modulelens.providers import anthropic

    def fake_urlopen(request, timeout):
        assert request.get_method() == "POST" and request.data == b"{}" and timeout == 5
        raise urllib.error.HTTPError(request.full_url, 429, "Too Many", {"retry-after": "3"}, io.BytesIO(b"slow"))

    monkeypatch.setattr(anthropic.urllib.request, "urlopen", fake_urlopen)
    status, headers, body = anthropic.UrllibTransport().post("https://x/v1/messages", {}, b"{}", 5)
    assert (status, headers["retry-after"], body) == (429, "3", b"slow")


# --- template ---------------------------------------------------------------------------------


@pytest.fixture
def fake_templates(monkeypatch):
    """The template library cut down to three layer-norm variants: the provider's own logic alone."""
    from modulelens.providers import template

    calls = []

    def variants(card, backend):
        return 3 if card.op == "aten.native_layer_norm.default" else 0

    def render(card, backend, variant=0):
        calls.append(variant)
        return KernelSource(backend=backend, source=f"// layer norm v{variant}\n", family="layernorm",
                            params={"block": 64 * (variant + 1)}, provider="template")

    monkeypatch.setattr(template, "template_variants", variants)
    monkeypatch.setattr(template, "render_template", render)
    return calls


def test_template_provider_mutates_the_parent_deterministically(fake_templates, card):
    p = get_provider("template")
    first = p.generate(GenerationRequest(card=card, backend="cpp"), None)
    assert first.params == {"block": 64, "variant": 0} and first.provider == "template"
    assert first.provenance["template"] == "layernorm" and first.provenance["variant"] == 0
    assert "parent" not in first.provenance
    second = p.generate(GenerationRequest(card=card, backend="cpp", parent=first), None)
    assert second.params["variant"] == 1 and second.provenance["parent"] == first.sha256
    third = p.generate(GenerationRequest(card=card, backend="cpp", parent=second), None)
    fourth = p.generate(GenerationRequest(card=card, backend="cpp", parent=third), None)
    assert fourth.params["variant"] == 0  # wraps around the 3 variants
    assert fake_templates == [0, 1, 2, 0]
    # A parent from another provider does not set the variant; the request does.
    other = KernelSource(backend="cpp", source="x", provider="anthropic")
    assert p.generate(GenerationRequest(card=card, backend="cpp", parent=other, variant=2), None).params["variant"] == 2


def test_template_provider_refuses_a_variant_past_the_last(fake_templates, card):
    with pytest.raises(ModuleLensError, match="variant 3 does not exist for the cpp template of aten.native_layer_norm") as e:
        get_provider("template").generate(GenerationRequest(card=card, backend="cpp", variant=3), None)
    assert "0 to 2" in e.value.hint and fake_templates == []


def test_template_provider_without_a_template(fake_templates):
    with pytest.raises(ModuleLensError, match="no built-in template covers aten.mm.default") as e:
        get_provider("template").generate(GenerationRequest(card=_card("aten.mm.default"), backend="cuda"), None)
    assert "anthropic" in e.value.hint


# --- sampling ---------------------------------------------------------------------------------


def test_sampling_without_an_mcp_client(card):
    from modulelens.registry import ToolContext

    with pytest.raises(ModuleLensError) as e:
        get_provider("sampling").generate(GenerationRequest(card=card, backend="cpp"), ToolContext())
    assert "only available when modulelens runs as an MCP server" in e.value.message
    assert "template" in e.value.hint and "validate_kernel" in e.value.hint


def test_sampling_with_a_sample_function(card):
    seen = []

    def sample(system, user, max_tokens):
        seen.append((system, user, max_tokens))
        return CPP_REPLY, "client-model-1"

    ks = get_provider("sampling").generate(GenerationRequest(card=card, backend="cpp"),
                                           pytypes.SimpleNamespace(sample=sample))
    assert ks.provider == "sampling" and ks.source.startswith("#include")
    assert ks.provenance["model"] == "client-model-1" and len(ks.provenance["prompt_sha256"]) == 64
    assert "aten.native_layer_norm.default" in seen[0][1] and seen[0][2] > 0


def _sampling_server(card):
    """An MCPServer with tools that sample the client's model: directly (sample_via_mcp on the
    event loop) and as modulelens tools do (a worker thread calling ctx.sample)."""
    import anyio.to_thread

    from modulelens.providers.sampling import sample_via_mcp, thread_sampler
    from modulelens.registry import ToolContext

    server = MCPServer("sampling-test")

    @server.tool()
    async def ask(prompt: str, ctx: Context) -> str:
        try:
            text, model = await sample_via_mcp(ctx, "be brief", prompt, 100)
        except ModuleLensError as e:
            return f"ERROR {e.message} | {e.hint}"
        return f"{model}: {text}"

    @server.tool()
    async def generate(ctx: Context) -> str:
        tctx = ToolContext()
        tctx.sample = thread_sampler(ctx)  # what the MCP adapter puts on the ToolContext
        req = GenerationRequest(card=card, backend="cpp")
        ks = await anyio.to_thread.run_sync(lambda: get_provider("sampling").generate(req, tctx))
        return ks.model_dump_json()

    return server


def _run_client(server, callback, mode, calls):
    import anyio
    from mcp import Client

    async def main():
        out = []
        async with Client(server, sampling_callback=callback, mode=mode) as client:
            for name, args in calls:
                r = await client.call_tool(name, args)
                assert not r.is_error, r
                out.append(r.structured_content if r.structured_content is not None else r.content[0].text)
        return out

    return anyio.run(main)


def test_sampling_round_trip_through_an_mcp_client(card):
    import mcp.types as types

    requests = []

    async def callback(context, params: types.CreateMessageRequestParams):
        requests.append(params)
        return types.CreateMessageResult(role="assistant", model="client-llm",
                                         content=types.TextContent(type="text", text=CPP_REPLY), stop_reason="endTurn")

    server = _sampling_server(card)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asked, generated = _run_client(server, callback, "legacy", [("ask", {"prompt": "hello"}), ("generate", {})])
    assert asked["result"].startswith("client-llm: Here is a fused kernel.")
    assert requests[0].system_prompt == "be brief" and requests[0].max_tokens == 100
    assert requests[0].messages[0].role == "user" and requests[0].messages[0].content.text == "hello"

    ks = KernelSource.model_validate_json(generated["result"])
    assert ks.provider == "sampling" and ks.source.startswith("#include <torch/extension.h>")
    assert ks.provenance["model"] == "client-llm"
    assert "aten.native_layer_norm.default" in requests[1].messages[0].content.text
    assert "candidate" in requests[1].system_prompt.lower()
    from mcp.shared.exceptions import MCPDeprecationWarning

    assert not [w for w in caught if issubclass(w.category, MCPDeprecationWarning)]


def test_sampling_refused_by_the_client(card):
    import mcp.types as types

    async def callback(context, params):
        return types.ErrorData(code=-1, message="User rejected sampling request")

    (asked,) = _run_client(_sampling_server(card), callback, "legacy", [("ask", {"prompt": "x"})])
    assert "did not answer the sampling request" in asked["result"] and "User rejected" in asked["result"]


def test_sampling_with_a_client_that_cannot_sample(card):
    (asked,) = _run_client(_sampling_server(card), None, "legacy", [("ask", {"prompt": "x"})])
    assert asked["result"].startswith("ERROR MCP sampling is only available") and "did not declare" in asked["result"]


def test_sampling_on_the_default_protocol_asks_through_input_required(card):
    """Protocol 2026-07-28 (what mcp.Client negotiates by default with an mcp 2.x server) has no
    server-to-client requests in the middle of a tool call: sample_via_mcp asks for the sample with
    SamplingInputRequired, which the modulelens MCP server answers with an InputRequiredResult
    (the whole round trip over mcp.Client: tests/test_mcp_long.py)."""
    from modulelens.providers.sampling import SamplingInputRequired, sample_via_mcp

    server = MCPServer("sampling-input-required")

    @server.tool()
    async def ask(prompt: str, ctx: Context) -> str:
        try:
            await sample_via_mcp(ctx, "be brief", prompt, 100)
        except SamplingInputRequired as need:
            return f"{need.key} {need.request.params.messages[0].content.text} {need.request.params.max_tokens}"
        return "not asked"

    async def callback(context, params):
        raise AssertionError("not reached")

    (asked,) = _run_client(server, callback, "auto", [("ask", {"prompt": "x"})])
    assert asked["result"].startswith("sample-") and asked["result"].endswith(" x 100")


def test_every_stored_value_kind_is_described():
    """The prompt describer reads every kind of the value-spec fixture (no kind raises)."""
    import json
    from pathlib import Path

    from modulelens.providers.values import describe_value

    fixture = json.loads((Path(__file__).parent / "fixtures" / "value_specs_all_kinds.json").read_text())
    described = {name: describe_value(spec, None) for name, spec in fixture["value"]["items"] if isinstance(name, str)}
    assert described["t"] == ("torch::Tensor", "torch.Tensor", "Tensor, shape [2, 3], float32, strides [3, 1] (contiguous)")
    assert described["none"][2] == "None" and described["inf"] == ("double", "float", "float = inf")
    assert described["size"] == ("std::vector<int64_t>", "list[int]", "list of int = [2, 3]")
    assert described["dt"] == ("at::ScalarType", "torch.dtype", "torch.dtype = bfloat16")
    assert describe_value(fixture["unrecorded"], None)[0] == "py::object"
