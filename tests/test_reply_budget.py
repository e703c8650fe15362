"""Every reply and resource an agent reads over MCP within 8,000 characters, what was cut named in
``left_out``: ``show candidate`` and ``show report`` of a validation with many checks, edge cases,
isolation details and wrapper evidence (the stored report keeps it all), and the result schema of
every tool, whose models that do not fit have a page of their own."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import mcp

from modulelens.listing import MAX_REPLY_CHARS
from modulelens.mcp_server.server import build_server
from modulelens.registry import ToolContext
from modulelens.sandbox import Isolation
from modulelens.tools import all_tools, get_tool
from modulelens.validation.report import Check, ValidationReport

LONG = "the candidate process ran with this layer in force, as the kernel reported it; " * 6


def _big_report() -> ValidationReport:
    isolation = Isolation()
    for i in range(9):
        isolation.add(f"layer {i}", in_force=i != 4, detail=LONG)
    checks = [Check(name=f"seed {s} sample {i}: outputs agree within tolerance", passed=True, detail=LONG)
              for s in range(7) for i in range(7)]
    return ValidationReport(verdict="custom", correct=True, reason="fine", stage="done", backend="cpp", checks=checks,
                            isolation=isolation, wrapper_evidence=LONG * 4,
                            edge_cases=[f"edge case {i} (the operator's own)" for i in range(40)])


def _read(server, calls):
    async def main():
        async with mcp.Client(server) as c:
            return [await step(c) for step in calls]

    return anyio.run(main)


def test_show_candidate_and_report_fit_and_name_what_they_cut(softmax_card):
    from modulelens.kernels import load_candidate
    from modulelens.repo import Repository
    from modulelens.validation import ValidationSettings, save_report

    repo, card = softmax_card
    gen = get_tool("generate_kernel")
    cand = gen(gen.request(card=card, backend="cpp", provider="template"), ToolContext(repo_root=repo))
    art, _ = load_candidate(Repository(repo), cand.candidate_id)
    report = _big_report()
    stored = save_report(Repository(repo), art, report, ValidationSettings(card_id=card)).ref
    assert len(report.model_dump_json()) > 2 * MAX_REPLY_CHARS

    async def show(c, kind, ref):
        reply = await c.call_tool("show", {"kind": kind, "ref": ref})
        assert not reply.is_error, reply.content
        return len(reply.content[0].text), reply.structured_content

    (size_c, shown_c), (size_r, shown_r) = _read(build_server(all_tools(), repo_root=repo), [
        lambda c: show(c, "candidate", cand.candidate_id), lambda c: show(c, "report", stored)])
    assert size_c <= MAX_REPLY_CHARS and size_r <= MAX_REPLY_CHARS, (size_c, size_r)
    assert {x["field"] for x in shown_c["left_out"]} >= {"report.checks", "report.edge_cases", "report.wrapper_evidence",
                                                          "report.isolation.layers.detail"}
    assert {x["field"] for x in shown_r["left_out"]} == {"checks", "edge_cases", "wrapper_evidence",
                                                          "isolation.layers.detail"}
    for cut in shown_c["left_out"] + shown_r["left_out"]:
        if cut["field"] != "source":
            whole = ValidationReport.model_validate_json(Path(cut["full"]).read_text())
            assert len(whole.checks) == 49 and len(whole.edge_cases) == 40
    layers = {x["name"]: x for x in shown_r["isolation"]["layers"]}
    assert layers["layer 4"]["detail"] == LONG and layers["layer 0"]["detail"] == ""  # what is missing keeps its why
    assert len(shown_r["checks"]) == 20


def test_every_tools_result_schema_fits_and_its_models_left_out_have_pages():
    tools = [t for t in all_tools() if t.mcp]

    async def pages(c):
        out = {}
        for t in tools:
            text = (await c.read_resource(f"modulelens://schemas/{t.name}")).contents[0].text
            out[t.name] = (len(text), json.loads(text))
            for cut in out[t.name][1].get("left_out", []):
                more = (await c.read_resource(cut["full"])).contents[0].text
                out[cut["full"]] = (len(more), json.loads(more))
        return out

    (read,) = _read(build_server(all_tools()), [pages])
    assert max(size for size, _ in read.values()) <= MAX_REPLY_CHARS, {k: s for k, (s, _) in read.items()}
    assert "left_out" in read["validate_kernel"][1] and "left_out" in read["show"][1]
    for t in tools:
        schema = read[t.name][1]
        for model in t.result_models:
            page = (schema.get("$defs", {}).get(model.__name__)
                    or read.get(f"modulelens://schemas/{t.name}.{model.__name__}", (0, None))[1]
                    or schema)
            assert set(page["properties"]) == set(model.model_fields), (t.name, model.__name__)
