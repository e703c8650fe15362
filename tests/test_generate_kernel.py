"""generate_kernel through the front ends: the sampling provider over a real mcp.Client round trip,
and clear errors for providers that cannot run."""

from __future__ import annotations

import anyio
import mcp
import pytest
from mcp import types


KERNEL = """#include <torch/extension.h>
torch::Tensor forward(torch::Tensor x, int64_t dim, bool half_to_float) {
    auto y = torch::empty_like(x);
    return y;
}
"""


@pytest.fixture(scope="module")
def card(softmax_card):
    return softmax_card


def test_sampling_provider_asks_the_clients_model(card):
    from modulelens.mcp_server.server import build_server
    from modulelens.tools import all_tools

    repo, card_id = card
    seen = {}

    async def sampling_callback(context, params: types.CreateMessageRequestParams):
        seen["system"] = params.system_prompt
        seen["user"] = params.messages[0].content.text
        return types.CreateMessageResult(
            role="assistant", model="client-model-1", stop_reason="endTurn",
            content=types.TextContent(type="text", text=f"Here you go:\n```cpp\n{KERNEL}```\n"),
        )

    async def session():
        server = build_server(all_tools(), repo_root=repo)
        async with mcp.Client(server, sampling_callback=sampling_callback, mode="legacy") as c:
            r = await c.call_tool("generate_kernel", {"card": card_id, "backend": "cpp", "provider": "sampling"})
            assert not r.is_error, r.content
            return r.structured_content

    out = anyio.run(session)
    assert out["provider"] == "sampling" and out["provenance"]["model"] == "client-model-1"
    assert "aten._softmax.default" in seen["user"] and "[16, 24]" in seen["user"]
    with open(out["source_path"]) as f:
        assert f.read().strip() == KERNEL.strip()


def test_sampling_outside_mcp_and_missing_key_are_clear_errors(cli, card, monkeypatch):
    repo, card_id = card
    code, err, _ = cli("generate-kernel", card_id, "--provider", "sampling", "--repo", repo, "--json")
    assert code == 2 and "MCP sampling" in err["error"]
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    code, err, _ = cli("generate-kernel", card_id, "--provider", "anthropic", "--repo", repo, "--json")
    assert code == 2 and "ANTHROPIC_API_KEY" in err["error"]
    code, err, _ = cli("generate-kernel", card_id, "--provider", "nope", "--repo", repo, "--json")
    assert code == 2 and "template" in (err["error"] + (err["hint"] or ""))


def test_out_of_range_template_variant_is_a_clear_error(cli, card):
    """A variant past the template's last one is refused with the valid range (it used to wrap
    around to variant 0 and store a duplicate candidate)."""
    from modulelens.kernels import templates
    from modulelens.ops import open_card
    from modulelens.repo import Repository

    repo, card_id = card
    _, stored = open_card(Repository(repo), card_id)
    count = templates.variants(stored, "cpp")
    assert count > 0
    code, out, _ = cli("generate-kernel", card_id, "--variant", str(count - 1), "--repo", repo, "--json")
    assert code == 0 and out["params"]["variant"] == count - 1
    code, err, _ = cli("generate-kernel", card_id, "--variant", str(count), "--repo", repo, "--json")
    assert code == 2
    text = err["error"] + " " + (err["hint"] or "")
    assert f"variant {count}" in text and f"0 to {count - 1}" in text and "softmax" in text
