"""Arguments an agent cannot get wrong without being told: a flag given ``"yes"`` (or 1) is refused
instead of read as true, memory and tensor sizes have an upper bound, descriptions say what a field
is, and the CLI counts a validation's checks over all it ran, not the ones its reply lists."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from modulelens.cli.kernel_views import checks_cell
from modulelens.listing import LeftOut
from modulelens.mcp_server.server import build_server
from modulelens.tools import all_tools
from modulelens.tools.validate_kernel import ValidateKernelResult
from modulelens.validation.report import Check


def _calls(tmp_path, calls):
    async def main():
        async with Client(build_server(all_tools(), repo_root=tmp_path / ".modulelens")) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            return listed, [await client.call_tool(name, arguments) for name, arguments in calls]

    return anyio.run(main)


REFUSED = [
    ("capture_module", {"script": "train.py", "backward": "yes"}, "backward: give true or false, not 'yes'"),
    ("validate_kernel", {"candidate": "x.card0:v1", "time": 1}, "time: give true or false, not 1"),
    ("start_job", {"tool": "capture_module", "arguments": {"script": "t.py", "export": "on"}},
     "export: give true or false, not 'on'"),
    ("validate_kernel", {"candidate": "x.card0:v1", "memory_limit_mb": 10**9}, "memory_limit_mb"),
    ("capture_module", {"script": "train.py", "max_tensor_bytes": 10**15}, "max_tensor_bytes"),
    ("capture_ops", {"ref": "blk", "max_tensor_bytes": 10**15}, "max_tensor_bytes"),
    ("capture_ops", {"ref": "blk", "strategy": "magic"}, "strategy"),
]


def test_loose_flags_and_sizes_past_their_bound_are_refused_before_anything_runs(tmp_path):
    _, replies = _calls(tmp_path, [(name, arguments) for name, arguments, _ in REFUSED])
    for (name, _, said), r in zip(REFUSED, replies, strict=True):
        text = r.content[0].text
        assert r.is_error and said in text, (name, text)
    assert not (tmp_path / ".modulelens" / "captures").exists()


@pytest.mark.parametrize(("tool", "field", "says"), [
    ("capture_module", "script", "KernelBench"), ("capture_module", "script", "training script"),
    ("gather_stats", "script", "training script"), ("start_job", "tool", "gather_stats"),
    ("validate_kernel", "memory_limit_mb", "MiB"),
])
def test_descriptions_say_what_a_field_is(tmp_path, tool, field, says):
    listed, _ = _calls(tmp_path, [])
    assert says.lower() in listed[tool].input_schema["properties"][field]["description"].lower()


def test_the_dispatch_mechanism_is_explained_once_for_run_and_check_pack(tmp_path):
    from modulelens.mcp_server.schema import shared_arguments_text

    listed, _ = _calls(tmp_path, [])
    for tool in ("run", "check_pack"):
        assert "description" not in listed[tool].input_schema["properties"]["mechanism"]  # said in the instructions
    assert "mechanism: How calls reach the pack's kernels: library" in shared_arguments_text()


def test_the_cli_counts_checks_over_every_one_that_ran():
    checks = [Check(name="special values", passed=False, detail="NaN")] + [
        Check(name=f"seed {i}", passed=True) for i in range(19)]
    reply = ValidateKernelResult(verdict="rejected", correct=False, reason="r", stage="check", backend="cpp",
                                 checks=checks, candidate_id="a.card0:v1", target="a:v1/0", report="a.card0.v1:v1",
                                 left_out=[LeftOut(field="checks", shown=20, total=49, full="/r.json")])
    assert "48/49 passed" in str(checks_cell(reply).forms[0])
    only_failures = reply.model_copy(update={"checks": [checks[0]] * 20})
    assert "at most 29/49 passed" in str(checks_cell(only_failures).forms[0])
    whole = reply.model_copy(update={"checks": checks[1:], "left_out": []})
    assert "19/19 passed" in str(checks_cell(whole).forms[0])


def test_capturing_from_a_script_says_what_the_script_prints(tmp_path):
    """While the script runs (capture_module, and capture_ops given a script) the progress message
    is its last printed line, not only "working (N s)"."""
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).parent / "scripts" / "chatty.py", tmp_path / "chatty.py")
    seen: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async def main():
        async with Client(build_server(all_tools(), repo_root=tmp_path / ".modulelens")) as client:
            r = await client.call_tool("capture_module", {"script": "chatty.py", "module": "1", "name": "loud"},
                                       progress_callback=on_progress)
            assert not r.is_error, r.content

    anyio.run(main)
    assert "running chatty.py until 1 is called: hello from the script: this line must not reach the MCP " \
           "protocol stream" in seen, seen


def test_capture_ops_says_what_it_is_doing(tmp_path):
    from conftest import capture_tanh_scale

    repo = tmp_path / ".modulelens"
    capture_tanh_scale(repo)
    seen: list[str | None] = []
    fractions: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message)
        fractions.append((progress, total))

    async def main():
        async with Client(build_server(all_tools(), repo_root=repo)) as client:
            r = await client.call_tool("capture_ops", {"ref": "scale", "repeats": 3}, progress_callback=on_progress)
            assert not r.is_error, r.content

    anyio.run(main)
    assert any(m and m.startswith("recording and timing the operators of scale") for m in seen), seen
    assert any(m and m.startswith("recorded scale:v1") for m in seen), seen
    assert any(m and m.startswith("timing each operator of scale:v1: repeat 2/3") for m in seen), seen
    assert any(m and m.startswith("storing ") and " cards" in m for m in seen), seen
    assert [p for p, _ in fractions] == sorted(p for p, _ in fractions) and len({p for p, _ in fractions}) >= 4
