"""Replies that stay within an agent's budget however large the input: show (search), validate_kernel,
profile, run and check_pack cut their long lists by default (``limit``), say in ``left_out`` what
they cut and where the whole data is, and give more up to the schema's maximum. Each is fed a
fabricated large result at the level of the function that cuts it (or the tool, its domain call
replaced)."""

from __future__ import annotations

from modulelens.dispatch.check import CaptureCheck
from modulelens.dispatch.runtime import EntryReport
from modulelens.validation.report import Check
from modulelens.listing import everything
from modulelens.profiling.breakdown import OpTime
from modulelens.profiling.targets import ProfileResult
from modulelens.registry import ToolContext
from modulelens.search.model import SearchSettings
from modulelens.search.summary import NodeLine, SearchSummary, TargetTree, keep_first_each
from modulelens.tools import get_tool
from modulelens.tools.check_pack import CheckPackRequest, CheckPackResult, keep_check_lists
from modulelens.tools.profile import ProfileRequest, keep_breakdown
from modulelens.tools.run import RunRequest, RunResult, keep_run_lists
from modulelens.tools.show import DEFAULT_TOP, ShowRequest

BUDGET = 8_000  # characters of structured content in a default reply


def _default_limit(request) -> int | None:
    return request.model_fields["limit"].default


def _size(result) -> int:
    return len(result.model_dump_json())


def _entry(i: int) -> EntryReport:
    return EntryReport(candidate_id=f"model.blocks.{i}.attn.card{i}:v3", kind="op",
                       target="aten::_scaled_dot_product_flash_attention_for_cpu.default", dispatched=True,
                       speedup_vs_eager=1.37, hits=120, fallbacks=3,
                       fallback_reasons={"non-contiguous input": 2, "dtype bfloat16 not in the pack": 1})


def test_show_search_cuts_nodes_shared_among_targets():
    summary = SearchSummary(search_id="s" * 16, settings=SearchSettings(), executor="local", runs=3, targets=[
        TargetTree(target=f"blk/{t}", op="aten::_softmax.default", best_path=[0, 1, 4], nodes=[
            NodeLine(node=n, parent=max(n - 1, 0), depth=n % 7, status="evaluated", verdict="custom",
                     speedup_vs_eager=1.2, latency_s=1.5e-5, candidate_id=f"blk.card{t}:v{n}", provider="template",
                     variant=n % 4, worker="local-0", report=f"blk.card{t}.v{n}:v1",
                     reason="correct on captured and fresh inputs; faster than eager") for n in range(200)])
        for t in range(3)])
    assert _size(summary) > 10 * BUDGET
    cut = keep_first_each(summary, "targets", "nodes", DEFAULT_TOP["searches"], lambda i, t: f"/j/{i}")
    assert _size(cut) <= BUDGET
    assert [(c.field, c.shown, c.total, c.full) for c in cut.left_out] == [
        (f"targets.{i}.nodes", 4, 200, f"/j/{i}") for i in range(3)]
    assert keep_first_each(summary, "targets", "nodes", None, lambda i, t: "") is summary
    assert everything(ShowRequest) == {"top": 100, "points": 2000, "full": True}


def test_validate_kernel_lists_its_first_checks_and_names_the_stored_report(softmax_card, monkeypatch):
    """Many seeds make many checks: the reply lists the first ones; the stored report has all."""
    from modulelens.validation.sandboxed import CandidateValidation
    from modulelens.tools import validate_kernel as tool_module

    repo, card = softmax_card
    gen = get_tool("generate_kernel")
    cand = gen(gen.request(card=card, backend="cpp", provider="template"), ToolContext(repo_root=repo))
    checks = [Check(name=f"seed {s} sample {i}: outputs agree within tolerance", passed=True,
                    detail="max abs error 1.19e-07 (atol 1e-05, rtol 1.3e-06) over 384 elements")
              for s in range(10) for i in range(30)]
    late_failure = Check(name="seed 9 sample 29: special values", passed=False, detail="NaN where eager has 0")
    checks.insert(250, late_failure)
    stored = {}

    def fake_validation(repo_, art, src, settings, **kwargs):
        from modulelens.validation.stored_reports import save_report
        from modulelens.validation.report import ValidationReport

        report = ValidationReport(verdict="custom", correct=True, reason="fine", stage="done", backend="cpp",
                                  checks=checks)
        stored["ref"] = save_report(repo_, art, report, settings).ref
        return CandidateValidation(**report.model_dump(), candidate_id=art.ref, target=card, report=stored["ref"])

    monkeypatch.setattr(tool_module, "validate_candidate", fake_validation)
    tool = get_tool("validate_kernel")
    result = tool(tool.request(candidate=cand.candidate_id, seeds=10), ToolContext(repo_root=repo))
    assert _size(result) <= BUDGET and len(result.checks) == 20
    assert result.checks[0] == late_failure  # a failed check is listed first, wherever it fell
    (cut,) = result.left_out
    assert (cut.field, cut.shown, cut.total) == ("checks", 20, 301)
    assert cut.full.endswith("report.json") and stored["ref"].split(":")[0] in cut.full
    most = tool(tool.request(candidate=cand.candidate_id, seeds=10, limit=100), ToolContext(repo_root=repo))
    assert len(most.checks) == 100 and most.left_out[0].total == 301


def test_profile_lists_the_operators_that_took_most_time():
    ops = [OpTime(op=f"aten::op_{i}", input_shapes=str([[64, 128, 256]] * 6), calls_per_run=4.0,
                  self_s_per_run=1e-3 / (i + 1), share=0.01) for i in range(150)]
    result = ProfileResult(median_s=1e-3, p20_s=9e-4, p80_s=1.1e-3, runs=100, samples=20, warmup=3,
                           timer="torch.utils.benchmark", device="cpu", threads=1, cache="warm", target="blk",
                           target_kind="capture", what="one forward call", grad_enabled=False, breakdown=ops)
    assert _size(result) > 3 * BUDGET
    cut = keep_breakdown(result, _default_limit(ProfileRequest))
    assert _size(cut) <= BUDGET and [o.op for o in cut.breakdown] == [f"aten::op_{i}" for i in range(10)]
    assert [(c.field, c.shown, c.total) for c in cut.left_out] == [("breakdown", 10, 150)]
    no_breakdown = result.model_copy(update={"breakdown": None})
    assert keep_breakdown(no_breakdown, 10) is no_breakdown


def test_run_lists_its_first_entries_and_outputs():
    result = RunResult(exit_code=0, hits=1000, fallbacks=10, mechanism="dispatcher",
                       entries=[_entry(i) for i in range(80)], steps=2000, step_kind="optimizer.step",
                       outputs_with=[2.0 / (i + 1) for i in range(2000)],
                       outputs_without=[2.0 / (i + 1.5) for i in range(2000)], script_output_tail="x" * 2000)
    assert _size(result) > 10 * BUDGET
    cut = keep_run_lists(result, _default_limit(RunRequest))
    assert _size(cut) <= BUDGET
    assert [(c.field, c.shown, c.total) for c in cut.left_out] == [
        ("entries", 10, 80), ("outputs_with", 10, 2000), ("outputs_without", 10, 2000)]


def test_check_pack_lists_some_captures_and_shares_entries_among_them():
    checks = [CaptureCheck(capture=f"model.blocks.{c}.attn:v2", strategy="source", matches_captured=c != 5,
                           matches_eager=True, max_abs_error=3e-7, hits=40, fallbacks=0,
                           entries=[_entry(i) for i in range(40)], eager_median_s=1e-3, pack_median_s=8e-4,
                           speedup=1.25, detail="all outputs agree within float32 tolerances") for c in range(30)]
    result = CheckPackResult(ok=False, checks=checks)
    assert _size(result) > 30 * BUDGET
    for limit, shown_checks, shown_entries in ((_default_limit(CheckPackRequest), 8, 1), (2, 2, 1), (None, 30, 40)):
        cut = keep_check_lists(result, limit)
        assert len(cut.checks) == shown_checks and {len(c.entries) for c in cut.checks} == {shown_entries}
        assert cut.ok is False
    cut = keep_check_lists(result, _default_limit(CheckPackRequest))
    assert _size(cut) <= BUDGET
    assert cut.left_out[0].model_dump(include={"field", "shown", "total"}) == {"field": "checks", "shown": 8,
                                                                              "total": 30}
    assert [c.field for c in cut.left_out[1:]] == [f"checks.{i}.entries" for i in range(8)]
    single = keep_check_lists(CheckPackResult(ok=True, checks=checks[:1]), 8)
    assert len(single.checks[0].entries) == 8


# -- the CLI says what it left out ----------------------------------------------------------


def test_cli_views_say_what_a_result_left_out(softmax_card):
    from click.testing import CliRunner

    from modulelens.cli.app import build_app
    from modulelens.tools import all_tools

    repo, _ = softmax_card
    runner = CliRunner()
    app = build_app(all_tools())
    r = runner.invoke(app, ["show", "capture", "sm", "--tensors", "--top", "1", "--repo", str(repo)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "1 more tensors not shown (--top N to see more; full data: modulelens://captures/sm:v1)" in text
    whole = runner.invoke(app, ["show", "capture", "sm", "--tensors", "--repo", str(repo)])
    assert whole.exit_code == 0 and "not shown" not in whole.stdout


def test_left_out_notes_name_the_option_that_shows_more():
    from modulelens.cli.views import left_out_notes
    from modulelens.listing import LeftOut

    cut = CheckPackResult(ok=True, checks=[], left_out=[LeftOut(field="checks", shown=8, total=30, full="again")])
    (note,) = left_out_notes(cut, CheckPackRequest)
    assert note.plain == "22 more checks not shown (--limit N to see more; full data: again)"
    view = SearchSummary.model_construct(left_out=[
        LeftOut(field="steps", shown=5, total=9, full="/s.json"), LeftOut(field="modules", shown=3, total=4, full="/s.json")])
    assert [n.plain.split("(")[1].split(" N")[0] for n in left_out_notes(view, ShowRequest)] == ["--points",
                                                                                                       "--top"]
