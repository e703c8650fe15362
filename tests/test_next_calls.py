"""``next`` at each fork of the loop, as a table of (result state -> the call suggested): after a
validation (card kernels by the agent or by a provider, module candidates), after a pack, after a
check; and over MCP, an agent's own rejected ModelNew leads back to its source (never to a
provider that would replace it) and a finished job lifts its result's warnings and ``next``."""

from __future__ import annotations

import time

import anyio
import mcp
import pytest

from modulelens.mcp_server.jobs import job_status_of
from modulelens.mcp_server.server import build_server
from modulelens.tools import all_tools
from modulelens.tools.check_pack import CheckPackResult, check_pack_next
from modulelens.tools.pack import PackedEntry, PackRequest, pack_next
from modulelens.validation import ValidationReport, report_next

CID = "blk.card3:v1"


def _report(verdict: str, correct: bool, timing: str | None = None, interval: list[float] | None = None):
    return ValidationReport(verdict=verdict, correct=correct, reason="r", stage="done", backend="cpp",
                            timing_status=timing, speedup_interval=interval)


REJECTED = _report("rejected", False)
WRAPPER = _report("wrapper", True, "ok", [0.9, 1.1])
NOT_TIMED = _report("custom", True)
UNDETERMINED = _report("custom", True, "undetermined", [0.8, 1.6])
NOT_TIMEABLE = _report("custom", True).model_copy(update={"timing_note": "no GPU: the interpreter is not timed"})
SLOWER = _report("custom", True, "ok", [0.7, 0.9])
FASTER = _report("custom", True, "ok", [1.3, 1.5])

VALIDATIONS = [
    # (state, report, provider, source file, module?) -> calls
    ("agent's kernel rejected, from a file", REJECTED, "agent", "k.cpp", False,
     [("validate_kernel", {"source": "k.cpp", "target": "blk/3", "backend": "cpp"})]),
    ("agent's kernel rejected, given as text", REJECTED, "agent", None, False,
     [("validate_kernel", {"target": "blk/3", "backend": "cpp"})]),
    ("agent's kernel a wrapper", WRAPPER, "agent", "k.cpp", False,
     [("validate_kernel", {"source": "k.cpp", "target": "blk/3", "backend": "cpp"})]),
    ("agent's kernel correct, not faster", SLOWER, "agent", "k.cpp", False,
     [("validate_kernel", {"source": "k.cpp", "target": "blk/3", "backend": "cpp"})]),
    ("template kernel rejected", REJECTED, "template", None, False,
     [("generate_kernel", {"card": "blk/3", "parent": CID, "provider": "template", "backend": "cpp"})]),
    ("sampled kernel a wrapper", WRAPPER, "sampling", None, False,
     [("generate_kernel", {"card": "blk/3", "parent": CID, "provider": "sampling", "backend": "cpp"})]),
    ("custom, not timed", NOT_TIMED, "template", None, False, [("validate_kernel", {"candidate": CID, "time": True})]),
    ("custom, not timeable here", NOT_TIMEABLE, "agent", "k.py", False, []),
    ("custom, speed undetermined", UNDETERMINED, "agent", "k.cpp", False,
     [("validate_kernel", {"candidate": CID, "time": True})]),
    ("custom, surely faster", FASTER, "agent", "k.cpp", False, [("pack", {"candidates": [CID], "out": "blk.pack"})]),
    ("ModelNew rejected", REJECTED, "agent", "m.py", True, [("validate_kernel", {"source": "m.py", "target": "blk:v1"})]),
    ("ModelNew speed undetermined", UNDETERMINED, "agent", "m.py", True,
     [("validate_kernel", {"candidate": CID, "time": True})]),
]


@pytest.mark.parametrize(("state", "report", "provider", "source", "module", "expected"), VALIDATIONS,
                         ids=[row[0] for row in VALIDATIONS])
def test_after_a_validation(state, report, provider, source, module, expected):
    target = "blk:v1" if module else "blk/3"
    got = report_next(report, CID, target, source, provider=provider, module=module)
    assert [(c.tool, c.arguments) for c in got] == expected, state


def _entry(cid: str, verdict: str, interval: list[float] | None, dispatched: bool, skip: str | None = None):
    return PackedEntry(candidate_id=cid, kind="op", target="aten.x", backend="cpp", verdict=verdict,
                       speedup_interval=interval, dispatched=dispatched, skip_reason=skip)


USED = _entry("a.card1:v1", "custom", [1.2, 1.4], True)
UNTIMED = _entry("b.card2:v1", "custom", None, False, "not timed against eager with an interval: x")
SLOW = _entry("c.card3:v1", "custom", [0.8, 1.1], False, "not surely faster than eager")
WRONG = _entry("d.card4:v1", "rejected", None, False, "not validated correct (rejected: r)")

PACKS = [
    ("an entry will be used", [USED, SLOW], [("check_pack", {"pack": "p:v1"})]),
    ("none used: not timed", [UNTIMED], [("validate_kernel", {"candidate": UNTIMED.candidate_id, "time": True})]),
    ("none used: not faster", [SLOW],
     [("pack", {"candidates": ["x"], "out": "p.pack", "force": True})]),
    ("none used: rejected", [WRONG], [("show", {"kind": "candidates", "ref": WRONG.candidate_id})]),
    ("none used: each reason", [WRONG, SLOW, UNTIMED],
     [("validate_kernel", {"candidate": UNTIMED.candidate_id, "time": True}),
      ("show", {"kind": "candidates", "ref": WRONG.candidate_id}),
      ("pack", {"candidates": ["x"], "out": "p.pack", "force": True})]),
]


@pytest.mark.parametrize(("state", "entries", "expected"), PACKS, ids=[row[0] for row in PACKS])
def test_after_a_pack(state, entries, expected):
    got = pack_next(entries, PackRequest(candidates=["x"], out="p.pack"), "p:v1")
    assert [(c.tool, c.arguments) for c in got] == expected, state


CHECKS = [
    ("passing, captured from a script", True, [("train.py", ["--steps", "2"])],
     [("run", {"script": "train.py", "script_args": ["--steps", "2"], "pack": "p:v1", "compare": True})]),
    ("passing, captured with the Python API", True, [None], [("run", {"pack": "p:v1", "compare": True})]),
    ("failing", False, [("train.py", [])], [("show", {"kind": "packs", "ref": "p:v1"})]),
]


@pytest.mark.parametrize(("state", "ok", "scripts", "expected"), CHECKS, ids=[row[0] for row in CHECKS])
def test_after_a_check(state, ok, scripts, expected):
    result = CheckPackResult(ok=ok, hits=3 if ok else 0, checks=[])
    got = check_pack_next(result, "p:v1", scripts)
    assert [(c.tool, c.arguments) for c in got] == expected, state


def test_a_finished_job_lifts_its_results_warnings_and_next():
    from modulelens.jobs import JobRecord

    record = JobRecord(job="validate_kernel-0123abcd", tool="validate_kernel", state="done",
                       started_at="2026-01-01T00:00:00+00:00", ended_at="2026-01-01T00:00:05+00:00",
                       result={"warnings": ["flagged: x"], "next": [{"tool": "pack", "arguments": {"candidates": ["c"]}}]})
    status = job_status_of(record)
    assert status.warnings == ["flagged: x"]
    assert [(c.tool, c.arguments) for c in status.next] == [("pack", {"candidates": ["c"]})]


WRONG_MODEL = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self, dim):\n        super().__init__()\n" \
              "    def forward(self, x):\n        return x * 2.0\n"


@pytest.mark.slow
def test_an_agents_rejected_model_leads_back_to_its_source_also_through_a_job(scale_repo):
    async def main():
        async with mcp.Client(build_server(all_tools(), repo_root=scale_repo)) as c:
            args = {"source_text": WRONG_MODEL, "target": "scale", "seeds": 1, "time": False}
            direct = (await c.call_tool("validate_kernel", args)).structured_content
            job = (await c.call_tool("start_job", {"tool": "validate_kernel", "arguments": args})).structured_content
            deadline = time.monotonic() + 300
            status = job
            while status["state"] == "running" and time.monotonic() < deadline:
                status = (await c.call_tool("job_status", {"job": job["job"], "wait": 30})).structured_content
            return direct, status

    direct, status = anyio.run(main)
    assert direct["verdict"] == "rejected", direct["reason"]
    assert direct["next"] == [{"tool": "validate_kernel", "arguments": {"target": "scale:v1"}}], direct["next"]
    assert any("fix the source" in w and "source_text" in w for w in direct["warnings"]), direct["warnings"]
    assert not any(n["tool"] == "generate_kernel" for n in direct["next"])
    assert status["state"] == "done", status
    assert status["next"] == direct["next"] and status["warnings"] == status["result"]["warnings"], status
    assert any("fix the source" in w for w in status["warnings"])
