"""The whole loop as an agent drives it: the MCP server as a stdio subprocess, driven by the Python
SDK's stdio client on the example training script (capture, replay, export_repro, capture_ops,
generate_kernel, validate_kernel, pack, run, gather_stats, list, show, and the capture and schema
resources): every reply's structured content carries ``warnings`` and ``next``, its text is the
same data as compact JSON within the size an agent can read (8k characters, resources too), a pack run in which no kernel ran says so and claims no speedup,
and ``tools/list`` holds at most 24 tools in at most 15k characters.

One server session runs every step in order (each step uses what the one before made).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "tinyformer" / "train.py"
MAX_REPLY = 8_000
MAX_TOOLS_LIST = 15_000
MAX_TOOLS = 24


def reply_size(result) -> int:
    """Characters an agent reads: the text, which is the structured content as compact JSON (a
    client shows one or the other)."""
    return sum(len(block.text) for block in result.content if getattr(block, "text", None) is not None)


class Agent:
    """One stdio session; ``call`` checks that a reply is a success of readable size."""

    def __init__(self, session: ClientSession):
        self.session = session
        self.sizes: dict[str, int] = {}

    async def read(self, uri: str) -> dict:
        """A resource, which fits the same budget (recorded under its URI)."""
        (content,) = (await self.session.read_resource(uri)).contents
        self.sizes[uri] = len(content.text)
        assert len(content.text) <= MAX_REPLY, f"{uri} is {len(content.text)} characters"
        return json.loads(content.text)

    async def call(self, tool: str, arguments: dict) -> dict:
        result = await self.session.call_tool(tool, arguments)
        assert not result.is_error, f"{tool}: {result.content}"
        size = reply_size(result)
        self.sizes[tool] = max(size, self.sizes.get(tool, 0))  # each tool's largest reply
        assert size <= MAX_REPLY, f"{tool} replied {size} characters: " + ", ".join(
            f"{k} {len(json.dumps(v))}" for k, v in sorted(result.structured_content.items(), key=lambda kv: -len(json.dumps(kv[1])))[:6])
        (block,) = result.content
        assert isinstance(result.structured_content, dict)
        assert json.loads(block.text) == result.structured_content  # text-only clients see everything
        assert isinstance(result.structured_content["warnings"], list), tool
        assert isinstance(result.structured_content["next"], list), tool
        assert all(set(n) == {"tool", "arguments"} for n in result.structured_content["next"]), tool
        return result.structured_content


async def _run_loop(repo: Path, out: Path) -> dict:
    params = StdioServerParameters(command=sys.executable, args=["-m", "modulelens", "mcp", "--repo", str(repo)],
                                   cwd=str(ROOT))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        tools_list_chars = len(listed.model_dump_json(by_alias=True, exclude_none=True))
        agent = Agent(session)
        seen: dict = {"tools_list_chars": tools_list_chars, "tools": {t.name for t in listed.tools},
                      "tools_count": len(listed.tools)}

        cap = await agent.call("capture_module", {"script": str(TRAIN), "module": "blocks.1", "name": "blk",
                                                  "script_args": ["--steps", "2"]})
        seen["capture"] = cap
        seen["replay"] = await agent.call("replay_module", {"ref": "blk", "strategy": "source"})
        seen["repro"] = await agent.call("export_repro", {"ref": "blk", "out": str(out)})
        ops = await agent.call("capture_ops", {"ref": "blk"})
        seen["ops"] = ops
        card = next(c["card_id"] for c in ops["cards"] if "softmax" in c["op"])
        gen = await agent.call("generate_kernel", {"card": card, "backend": "cpp", "provider": "template"})
        seen["generated"] = gen
        seen["validated"] = await agent.call("validate_kernel", {"candidate": gen["candidate_id"], "seeds": 1})
        # Validated again without timing: correct, speed undetermined, so a pack will not use it.
        untimed = await agent.call("validate_kernel", {"candidate": gen["candidate_id"], "seeds": 1, "time": False})
        seen["untimed"] = untimed
        pack_file = str(out / "untimed.pack")
        seen["pack"] = await agent.call("pack", {"candidates": [gen["candidate_id"]], "out": pack_file})
        seen["run"] = await agent.call("run", {"script": str(TRAIN), "script_args": ["--steps", "3"],
                                               "pack": pack_file, "compare": True})
        seen["listed_candidates"] = await agent.call("list", {"kind": "candidates"})
        seen["candidate_shown"] = await agent.call("show", {"kind": "candidate", "ref": gen["candidate_id"]})
        seen["report_shown"] = await agent.call("show", {"kind": "report", "ref": seen["validated"]["report"]})
        seen["capture_resource"] = await agent.read("modulelens://captures/blk")
        seen["schema_resource"] = await agent.read("modulelens://schemas/validate_kernel")
        for cut in seen["schema_resource"].get("left_out", []):
            await agent.read(cut["full"])
        seen["stats"] = await agent.call("gather_stats", {"script": str(TRAIN), "script_args": ["--steps", "3"],
                                                          "every": 1})
        seen["stats_shown"] = await agent.call("show", {"kind": "stats", "ref": seen["stats"]["run_id"]})
        seen["capture_shown"] = await agent.call("show", {"kind": "capture", "ref": "blk", "tensors": True})
        misspelt = await session.call_tool("replay_module", {"ref": "blk", "strategi": "export"})
        seen["misspelt"] = (misspelt.is_error, misspelt.content[0].text)
        seen["sizes"] = agent.sizes
        return seen


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> dict:
    repo = tmp_path_factory.mktemp("repo")
    return anyio.run(_run_loop, repo, tmp_path_factory.mktemp("repros"))


def test_tools_list_fits_the_budget(loop):
    assert loop["tools_list_chars"] <= MAX_TOOLS_LIST, loop["tools_list_chars"]
    assert loop["tools_count"] <= MAX_TOOLS, loop["tools"]
    assert {"capture_module", "replay_module", "export_repro", "capture_ops", "generate_kernel",
            "validate_kernel", "gather_stats"} <= loop["tools"]


def test_capture_and_replay(loop):
    assert loop["capture"]["ref"] == "blk:v1" and loop["capture"]["module_path"] == "blocks.1"
    assert loop["replay"]["strategy"] == "source" and loop["replay"]["match"] is True
    assert Path(loop["repro"]["path"]).is_file()


def test_cards_are_cut_to_top_with_a_pointer_to_the_rest(loop):
    ops = loop["ops"]
    assert 0 < len(ops["cards"]) <= 10
    for cut in ops["left_out"]:
        assert cut["field"] == "cards" and cut["total"] > cut["shown"] == len(ops["cards"])
        assert Path(cut["full"]).is_file()


def test_generated_kernel_validates(loop):
    assert loop["generated"]["candidate_id"]
    validated = loop["validated"]
    assert validated["candidate_id"] == loop["generated"]["candidate_id"]
    assert validated["verdict"] == "custom" and validated["correct"] is True, validated["reason"]


def test_results_say_what_to_do_next_and_what_could_mislead(loop):
    assert loop["capture"]["next"][0] == {"tool": "replay_module", "arguments": {"ref": "blk:v1"}}
    assert loop["ops"]["next"][0]["tool"] == "generate_kernel"
    assert loop["generated"]["next"] == [{"tool": "validate_kernel",
                                          "arguments": {"candidate": loop["generated"]["candidate_id"]}}]
    untimed = loop["untimed"]
    assert untimed["correct"] and untimed["speedup_vs_eager"] is None
    assert any(w.startswith("not timed") for w in untimed["warnings"]), untimed["warnings"]
    assert untimed["next"] == [{"tool": "validate_kernel", "arguments": {"candidate": untimed["candidate_id"],
                                                                          "time": True}}]
    pack = loop["pack"]
    assert [e["dispatched"] for e in pack["entries"]] == [False]
    assert pack["warnings"][0] == "no entry of this pack will be used: every call will run eager"
    assert pack["next"] == untimed["next"]  # what makes its entry usable


def test_a_pack_run_in_which_no_kernel_ran_says_so_and_claims_no_speedup(loop):
    run = loop["run"]
    assert run["exit_code"] == 0 and run["hits"] == 0
    assert run["step_ratio"] is None and run["step_seconds_with"] is not None  # timings kept, no claim made
    assert run["timing_status"] == "undetermined" and "no pack kernel ran" in run["timing_reason"]
    assert any("no pack kernel ran (0 hits)" in w for w in run["warnings"]), run["warnings"]
    assert any("was not used" in w for w in run["warnings"]), run["warnings"]
    assert run["next"] and run["next"][0]["tool"] == "check_pack"


def test_stats_reply_and_views_fit(loop):
    stats, shown = loop["stats"], loop["stats_shown"]
    assert stats["source"] == "script" and stats["steps_sampled"] >= 1 and shown["entry"]["kind"] == "run"
    assert len(shown["modules"]) <= 3 and all(Path(c["full"]).is_file() for c in shown["left_out"])
    assert loop["capture_shown"]["tensors"]


def test_every_reply_fits(loop):
    assert set(loop["sizes"]) >= {"capture_module", "replay_module", "export_repro", "capture_ops",
                                  "generate_kernel", "validate_kernel", "gather_stats", "pack", "run", "list", "show",
                                  "modulelens://captures/blk", "modulelens://schemas/validate_kernel"}
    assert max(loop["sizes"].values()) <= MAX_REPLY, loop["sizes"]
    assert loop["schema_resource"]["left_out"]  # its models have pages of their own, read above
    assert loop["report_shown"]["left_out"] and loop["candidate_shown"]["entry"]["kind"] == "card"


def test_misspelt_argument_is_refused_with_did_you_mean(loop):
    is_error, text = loop["misspelt"]
    assert is_error and "'strategi'" in text and "did you mean strategy?" in text and "valid: ref, strategy" in text
