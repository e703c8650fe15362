"""How the CLI shows each tool's result to a person, keyed by the result model.

Every table goes through :class:`~modulelens.cli.tables.FittedTable`, so ids, references and
operator names are never cut at any terminal width (``--wide`` shows every column in full). A
result model without a view here falls back to the tool's own ``render`` or to
:func:`generic_view` (one row per field).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from rich.console import Group, RenderableType
from rich.text import Text

from modulelens.capture.summary import CaptureSummary, TensorInfo
from modulelens.cli.formats import dtypes_cell, list_cell, number, percent, seconds, shape, shapes_cell
from modulelens.cli.repo_views import REPO_VIEWS
from modulelens.cli.tables import Cell, Column, FittedTable, kv_table
from modulelens.dispatch.runtime import EntryReport
from modulelens.ops.replay import CardReplay
from modulelens.ops.summary import CardDetail, OpSetSummary
from modulelens.profiling.targets import ProfileResult
from modulelens.search.model import SearchResult
from modulelens.search.summary import NodeLine, SearchSummary
from modulelens.stats.runs import StatsFinding, StatsRunView, TensorStatsRow
from modulelens.tools.add_search_child import AddSearchChildResult
from modulelens.tools.capture_module import CaptureModuleResult
from modulelens.tools.check_pack import CheckPackResult
from modulelens.tools.export_repro import ExportReproResult
from modulelens.tools.gather_stats import GatherStatsResult
from modulelens.tools.generate_kernel import GenerateKernelResult
from modulelens.tools.install_skills import InstallSkillsResult
from modulelens.tools.lists import ListCandidatesResult, ListCapturesResult, ListOpsetsResult, ListStatsRunsResult
from modulelens.tools.pack import PackResult
from modulelens.tools.pull import PullResult
from modulelens.tools.push import PushResult
from modulelens.tools.replay_module import ReplayModuleResult, TensorMatch
from modulelens.tools.run import RunResult
from modulelens.tools.show import ShowCaptureResult
from modulelens.tools.tag_capture import TagCaptureResult
from modulelens.tools.trust_artifact import TrustResult
from modulelens.tools.validate_kernel import ValidateModuleResult
from modulelens.validation.catalog import CandidateView
from modulelens.validation.sandboxed import CandidateValidation

__all__ = ["View", "generic_view", "left_out_notes", "view_for"]

View = Callable[[Any, bool], RenderableType]  # (result, wide) -> what to print

_GOOD, _BAD, _WARN = "green", "red", "yellow"


def _yes_no(ok: bool) -> Cell:
    return Cell(("yes" if ok else "no",), style=_GOOD if ok else _BAD)


def _notes(lines: list[str], label: str = "note") -> list[RenderableType]:
    return [Text(f"{label}: {line}", style=_WARN) for line in lines]


# --------------------------------------------------------------------------------------------
# Captures
# --------------------------------------------------------------------------------------------


def _tensor_rows(label: str, tensors: list[TensorInfo]) -> list[tuple[str, str]]:
    if not tensors:
        return [(label, "none")]
    return [(label if i == 0 else "", f"{t.key} {t.dtype}{shape(t.shape)}" + ("" if t.stored else " (shape-only)"))
            for i, t in enumerate(tensors)]


def capture_summary_view(s: CaptureSummary, wide: bool, title: str | None = None) -> RenderableType:
    rows: list[tuple[str, str | Cell]] = [
        ("ref", s.ref + (f"  ({', '.join(s.aliases)})" if s.aliases else "")),
        ("module", f"{s.module_path or '<root>'}  ({s.class_path})  call {s.call_index}"),
        ("mode", "train" if s.training else "eval"),
        ("strategies", ", ".join(s.strategies) or "none"),
        *_tensor_rows("inputs", s.inputs),
        *_tensor_rows("outputs", s.outputs),
        ("weights", f"{s.weights} tensors"),
    ]
    if s.activations is not None and s.activations.mode != "full":
        rows.append(("activations", Cell((f"{s.activations.mode}: {s.activations.reason}",), style=_WARN)))
    if s.backward:
        rows.append(("backward", "gradients captured"))
    if s.rank is not None:
        rows.append(("rank", f"{s.rank} of {s.world_size}"))
    rows += [("unrecorded", Cell((u,), style=_WARN)) for u in s.unrecorded]
    rows += [("note", Cell((n,), style=_WARN)) for n in s.notes]
    rows.append(("path", s.path))
    return kv_table(rows, title=title or s.ref)


def show_capture_view(r: ShowCaptureResult, wide: bool) -> RenderableType:
    parts: list[RenderableType] = [capture_summary_view(r, wide)]
    if r.tensors:
        parts.append(_tensors_table(r.tensors, wide))
    return Group(*parts, *_notes(r.tensor_notes))


def capture_module_view(r: CaptureModuleResult, wide: bool) -> RenderableType:
    parts: list[RenderableType] = [capture_summary_view(r, wide, title=f"captured {r.ref} in {r.seconds:.1f} s")]
    if len(r.captures) > 1:
        parts.append(Text("captures (one per rank): " + ", ".join(r.captures)))
    if r.pushed:
        parts.append(Text(f"pushed: pull it elsewhere with `modulelens pull {r.pushed}`"))
    return Group(*parts)


def list_captures_view(r: ListCapturesResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("ref", "key", style="cyan"),
        Column("tags", "shrink", drop=3),
        Column("module", "key"),
        Column("class", "shrink", drop=1),
        Column("strategies", "shrink", drop=0),
        Column("created", "shrink", drop=2),
    ], title=f"captures in {r.repo}", wide=wide)
    for c in r.captures:
        table.add_row(
            c.ref, list_cell(c.tags, ","), c.module_path or "<root>",
            Cell((c.class_path, c.class_path.rpartition(":")[2])),
            Cell((", ".join(c.strategies), ",".join(c.strategies))) if c.strategies else "-",
            Cell((c.created_at, c.created_at[:16].replace("T", " "), c.created_at[:10])) if c.created_at else "-",
        )
    return table


def replay_module_view(r: ReplayModuleResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("value", "key"),
        Column("shape", "shrink", drop=3),
        Column("dtype", "value", drop=1),
        Column("max abs err", "value", justify="right"),
        Column("max rel err", "value", justify="right", drop=2),
        Column("allclose", "value"),
    ], title=f"replay of {r.ref} ({r.strategy})", wide=wide)

    def add(o: TensorMatch) -> None:
        table.add_row(o.name, Cell((shape(o.shape),)), o.dtype, number(o.max_abs_error), number(o.max_rel_error),
                      _yes_no(o.allclose))

    for o in r.outputs + r.state + (r.backward or []):
        add(o)
    verdict = (Text("exact match", style=_GOOD) if r.exact else Text("match", style=_GOOD) if r.match
               else Text("not compared", style=_WARN) if not r.compared else Text("MISMATCH", style=_BAD))
    judged = f", {r.tolerance_dtype}'s" if r.tolerance_dtype else ""
    summary = Text.assemble(verdict, f" (rtol {r.rtol:g}, atol {r.atol:g}{judged}); rebuild {r.reconstruction_seconds * 1e3:.1f} ms, "
                            f"run {r.run_seconds * 1e3:.1f} ms on {r.device}"
                            + ("; inputs synthesised" if r.synthesized_inputs else ""))
    failed = [Text(f"{a.strategy} failed: {a.error}", style=_WARN) for a in r.attempts]
    return Group(table, summary, *failed, *_notes(r.notes))


def export_repro_view(r: ExportReproResult, wide: bool) -> RenderableType:
    check = ("not run" if r.verified is None else Cell(("reproduces the capture",), style=_GOOD) if r.verified
             else Cell(("did not reproduce",), style=_BAD))
    rows: list[tuple[str, str | Cell]] = [("file", r.path), ("flavor", r.flavor), ("data", r.data_dir), ("check", check)]
    if r.max_abs_error is not None:
        rows.append(("max abs error", number(r.max_abs_error)))
    rows += [("skipped", s) for s in r.skipped]
    return kv_table(rows, title=f"repro of {r.ref}")


def tag_capture_view(r: TagCaptureResult, wide: bool) -> RenderableType:
    name = r.ref.rpartition(":")[0]
    return Text(f"{name}@{r.tag} -> {r.ref}" + (f" (was {r.previous})" if r.previous else ""))


# --------------------------------------------------------------------------------------------
# Operator cards and profiling
# --------------------------------------------------------------------------------------------


def cards_view(r: OpSetSummary, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("card", "key", style="cyan"),
        Column("op", "key"),
        Column("kind", "value", drop=3),
        Column("shapes", "shrink", drop=5),
        Column("dtypes", "shrink", drop=2),
        Column("calls", "value", justify="right", drop=1),
        Column("time/run", "value", justify="right", drop=4),
        Column("share", "value", justify="right", drop=6),
        Column("roofline", "value", justify="right", drop=0),
    ], title=f"operator cards {r.opset} (from {r.capture}, {r.strategy} replay)", wide=wide)
    for c in r.cards:
        table.add_row(c.card_id, c.op, c.kind + ("" if c.phase == "forward" else " (bw)"), shapes_cell(c.shapes),
                      dtypes_cell(c.dtypes), str(c.calls), seconds(c.time_s), percent(c.time_share),
                      percent(c.roofline_fraction) if c.roofline_fraction is not None else "-")
    caption = Text(f"module run: median {seconds(r.module_time_s)} (p20 {seconds(r.module_time_p20_s)}, "
                   f"p80 {seconds(r.module_time_p80_s)}) over {r.repeats} runs; listed cards cover "
                   f"{r.cards_time_share:.0%} of it, view operators {r.views_time_share:.0%}"
                   + (f"; roofline: achieved bandwidth of memory-bound cards over this machine's copy bandwidth "
                      f"({r.copy_bytes_per_s / 1e9:.2f} GB/s on {r.device})" if r.copy_bytes_per_s else ""),
                   style="dim")
    return Group(table, caption, *_notes(r.notes))


def list_opsets_view(r: ListOpsetsResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("opset", "key", style="cyan"),
        Column("tags", "shrink", drop=3),
        Column("capture", "key"),
        Column("cards", "value", justify="right"),
        Column("module run", "value", justify="right", drop=2),
        Column("device", "value", drop=1),
        Column("created", "shrink", drop=0),
    ], title=f"opsets in {r.repo}", wide=wide)
    for o in r.opsets:
        table.add_row(o.ref, list_cell(o.tags, ","), o.capture, str(o.cards), seconds(o.module_time_s),
                      o.device + (" +bw" if o.backward else ""),
                      Cell((o.created_at, o.created_at[:16].replace("T", " "), o.created_at[:10])) if o.created_at else "-")
    return table


def show_op_card_view(r: CardDetail, wide: bool) -> RenderableType:
    rows: list[tuple[str, str | Cell]] = [
        ("card", r.card_id),
        ("op", r.op),
        ("kind", f"{r.kind}, {r.phase}, on {r.device}"),
    ]
    inputs = [f"{d}{shape(s)}" + ("" if c else f" non-contiguous, strides {shape(st)}")
              for s, d, c, st in zip(r.shapes, r.dtypes, r.contiguous, r.strides)]
    rows += [("inputs" if i == 0 else "", x) for i, x in enumerate(inputs)] or [("inputs", "none")]
    rows += [
        ("other args", json.dumps(r.args, default=str)),
        ("calls", f"{r.calls} per module run"),
        ("time", f"median {seconds(r.time_s)} per run = {percent(r.time_share)} of the module"),
        ("bytes", f"{r.bytes_per_call} per call (inputs + outputs)"),
        ("samples", f"{len(r.samples)} stored, from capture {r.capture}"),
    ]
    return kv_table(rows, title=f"operator card {r.card_id}")


def replay_op_card_view(r: CardReplay, wide: bool) -> RenderableType:
    verdict = (Text("exact match", style=_GOOD) if r.exact else Text("match", style=_GOOD) if r.match
               else Text("MISMATCH", style=_BAD))
    detail = f" (max abs error {r.max_abs_error:g}, {r.outputs} output(s), {seconds(r.run_seconds)})"
    if not r.values_compared:
        detail += "; uninitialised outputs: only shapes and dtypes compared"
    if r.synthesized_inputs:
        detail += "; inputs synthesised"
    return Text.assemble(f"{r.card_id} {r.op} sample {r.sample}: ", verdict, detail)


def _compact_shapes(text: str) -> str:
    """The profiler's ``[[8, 32, 64], [64]]`` without spaces."""
    return re.sub(r",\s+", ",", text)


def profile_view(r: ProfileResult, wide: bool) -> RenderableType:
    rows: list[tuple[str, str | Cell]] = [
        ("timed call", r.what),
        ("median", f"{seconds(r.median_s)} per call (p20 {seconds(r.p20_s)}, p80 {seconds(r.p80_s)})"),
        ("runs", f"{r.runs} calls in {r.samples} samples after {r.warmup} warm-up calls"),
        ("timer", r.timer),
        ("device", f"{r.device}, {r.threads} threads, {r.cache}, autograd {'on' if r.grad_enabled else 'off'}"),
    ]
    if r.peak_memory_bytes is not None:
        rows.append(("peak memory", f"{r.peak_memory_bytes / 2**20:.2f} MiB ({r.peak_memory_method or ''})"))
    if r.roofline_fraction is not None and r.achieved_bytes_per_s is not None and r.copy_bytes_per_s is not None:
        rows.append(("bytes moved", f"{r.bytes_moved} per call"))
        rows.append(("bandwidth", f"{r.achieved_bytes_per_s / 1e9:.2f} GB/s = {percent(r.roofline_fraction)} of this "
                     f"machine's copy bandwidth ({r.copy_bytes_per_s / 1e9:.2f} GB/s)"))
    rows += [("note", Cell((n,), style=_WARN)) for n in r.notes]
    parts: list[RenderableType] = [kv_table(rows, title=f"profile of {r.target}")]
    if r.breakdown:
        table = FittedTable([
            Column("op", "key"),
            Column("input shapes", "shrink", drop=1),
            Column("calls", "value", justify="right", drop=0),
            Column("self time", "value", justify="right", drop=2),
            Column("share", "value", justify="right"),
        ], title="top operators by self time (torch.profiler, per call)", wide=wide)
        for o in r.breakdown:
            shapes = _compact_shapes(o.input_shapes)
            table.add_row(o.op, Cell((shapes,)), f"{o.calls_per_run:g}", seconds(o.self_s_per_run), percent(o.share))
        parts.append(table)
    return Group(*parts)


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


def generate_kernel_view(r: GenerateKernelResult, wide: bool) -> RenderableType:
    rows: list[tuple[str, str | Cell]] = [
        ("candidate", r.candidate_id),
        ("card", r.card),
        ("backend", r.backend),
        ("provider", r.provider),
    ]
    if r.family:
        rows.append(("template", r.family))
        rows.append(("params", " ".join(f"{k}={json.dumps(v, separators=(',', ':'), default=str)}"
                                        for k, v in r.params.items()) or "-"))
    rows.append(("source", r.source_path))
    if r.validation:
        verdict = str(r.validation.get("verdict", "?"))
        rows.append(("validation", Cell((f"{verdict}: {r.validation.get('reason', '')}",), style=_VERDICT.get(verdict, ""))))
    return kv_table(rows, title=f"generated {r.candidate_id}")


_VERDICT = {"custom": _GOOD, "wrapper": _WARN, "rejected": _BAD}


def _verdict_cell(verdict: str | None) -> Cell:
    return Cell((verdict,), style=_VERDICT.get(verdict, "")) if verdict else Cell(("not validated",), style="dim")


def _speedup(x: float | None) -> str:
    return f"{x:.2f}x" if x is not None else "-"


def _measured(point: float | None, interval: list[float] | None, status: str | None) -> str:
    """A speedup as reported: the point with its 95% interval, or undetermined with the interval."""
    span = f" (95% {interval[0]:.2f}x..{interval[1]:.2f}x)" if interval else ""
    if status == "ok" and point is not None:
        return f"{point:.2f}x{span}"
    return f"undetermined{span}" if status else "-"


def list_candidates_view(r: ListCandidatesResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("candidate", "key", style="cyan"),
        Column("card", "key"),
        Column("op", "key"),
        Column("backend", "value", drop=2),
        Column("provider", "value", drop=0),
        Column("verdict", "value"),
        Column("speedup", "value", justify="right", drop=1),
    ], title=f"candidates in {r.repo}", wide=wide)
    for c in r.candidates:
        table.add_row(c.candidate_id, c.card_id, c.op, c.backend, c.provider, _verdict_cell(c.verdict),
                      _speedup(c.speedup_vs_eager))
    return table


def show_candidate_view(r: CandidateView, wide: bool) -> RenderableType:
    e = r.entry
    rows: list[tuple[str, str | Cell]] = [
        ("card", f"{e.card_id} ({e.op}, {e.kind})"),
        ("backend", e.backend),
        ("provider", e.provider + (f", template {e.family}" if e.family else "")),
    ]
    if e.parent:
        rows.append(("parent", e.parent))
    verdict = _verdict_cell(e.verdict)
    rows.append(("verdict", Cell((f"{e.verdict}: {e.reason}",), style=verdict.style) if e.verdict else verdict))
    if e.speedup_vs_eager is not None:
        rows.append(("speedup", f"{_speedup(e.speedup_vs_eager)} vs eager"))
    rows += [("report", f"{e.report} ({e.reports} stored)" if e.report else "-"), ("source", r.source_path)]
    return kv_table(rows, title=f"candidate {e.candidate_id}")


def validate_kernel_view(r: CandidateValidation, wide: bool) -> RenderableType:
    head = Text.assemble((r.verdict, f"bold {_VERDICT[r.verdict]}"), f" {r.candidate_id} for {r.target} ({r.backend})")
    rows: list[tuple[str, str | Cell]] = [("reason", r.reason)]
    if r.timing_status is not None:
        rows.append(("speedup", _measured(r.speedup_vs_eager, r.speedup_interval, r.timing_status) + " vs eager"
                     + (", " + _measured(r.speedup_vs_compile, r.speedup_vs_compile_interval, r.compile_timing_status)
                        + " vs torch.compile" if r.compile_timing_status else "")))
    if r.eager and r.candidate:
        for label, t in (("eager", r.eager), ("candidate", r.candidate)):
            rows.append((label, f"{seconds(t.median_s)} (p20 {seconds(t.p20_s)}, p80 {seconds(t.p80_s)})"))
    if r.timing_note:
        rows.append(("timing", r.timing_note))
    passed = sum(c.passed for c in r.checks)
    rows.append(("checks", Cell((f"{passed}/{len(r.checks)} passed; stage reached: {r.stage}",),
                                style=_GOOD if passed == len(r.checks) and r.checks else _WARN)))
    rows += [("flag", Cell((f,), style=_WARN)) for f in r.flags]
    rows += [("error", Cell((e,), style=_BAD)) for e in (r.errors if wide else r.errors[:3])]
    rows.append(("report", r.report))
    parts: list[RenderableType] = [head, kv_table(rows)]
    shown = r.checks if wide else [c for c in r.checks if not c.passed]
    if shown:
        table = FittedTable([Column("check", "value"), Column("passed", "value"), Column("detail", "text")],
                            title="checks" if wide else "failed checks", wide=wide, stack=True)
        for c in shown:
            table.add_row(c.name, _yes_no(c.passed), c.detail or "-")
        parts.append(table)
    return Group(*parts)


def trust_view(r: TrustResult, wide: bool) -> RenderableType:
    state = ("signed now: trusted" if r.signed else "trusted") if r.trusted or r.signed else "NOT trusted"
    rows: list[tuple[str, str | Cell]] = [("artifact", r.ref),
                                          ("state", Cell((state,), style=_GOOD if r.trusted or r.signed else _WARN))]
    rows += [("code file", f"{name}: {why}") for name, why in r.code_files.items()]
    rows += [("imports", path) for path in r.class_paths]
    rows += [("outside path", Cell((path,), style=_BAD)) for path in r.escaping_paths]
    rows += [("checksum", Cell((problem,), style=_BAD)) for problem in r.checksum_problems]
    if not (r.trusted or r.signed):
        rows.append(("trust it", f"modulelens trust {r.ref} --yes"))
    return kv_table(rows, title=f"trust {r.ref}")


def push_view(r: PushResult, wide: bool) -> RenderableType:
    table = FittedTable([Column("pushed", "key", style="cyan"), Column("pull it with", "key"),
                         Column("aliases", "text"), Column("files", "value", justify="right"),
                         Column("inputs", "text")],
                        title=f"pushed ({'offline: upload with `wandb sync ' + r.run + '`' if r.offline else r.run})",
                        wide=wide)
    for a in r.pushed:
        inputs = ", ".join(a.uses) or ("not on the remote: " + ", ".join(a.unresolved_uses) if a.unresolved_uses else "-")
        table.add_row(a.ref, a.address, ", ".join(a.aliases), str(a.files), inputs)
    return table


def pull_view(r: PullResult, wide: bool) -> RenderableType:
    state = "trusted" if r.trusted else "NOT trusted"
    rows: list[tuple[str, str | Cell]] = [("stored as", r.ref + (" (already present)" if r.already_present else "")),
                                          ("from", r.origin), ("origin ref", r.origin_ref), ("files", str(r.files)),
                                          ("state", Cell((state,), style=_GOOD if r.trusted else _WARN))]
    rows += [("path", r.path)] if r.path else []
    rows += [("tags", ", ".join(r.tags))] if r.tags else []
    rows += [("tags not set", "; ".join(r.tags_not_set))] if r.tags_not_set else []
    if r.next_step:
        rows.append(("next", r.next_step))
    return kv_table(rows, title=f"pulled {r.ref}")


# --------------------------------------------------------------------------------------------
# Searches
# --------------------------------------------------------------------------------------------


def optimize_view(r: SearchResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("card", "key", style="cyan"),
        Column("op", "key"),
        Column("best candidate", "key"),
        Column("vs eager", "value", justify="right"),
        Column("vs compile", "value", justify="right", drop=1),
        Column("roofline", "value", justify="right", drop=2),
        Column("evals", "value", justify="right", drop=3),
        Column("stopped", "value", drop=0),
    ], title=f"search {r.search_id}" + (" (resumed)" if r.resumed else ""), wide=wide)
    for t in r.targets:
        table.add_row(t.target, t.op, t.best_candidate or "-", _speedup(t.speedup_vs_eager),
                      _speedup(t.speedup_vs_compile), percent(t.roofline_fraction), str(t.evaluations),
                      t.stopped_because or "-")
    caption = Text(f"{r.evaluations} evaluations ({r.evaluations_this_run} in this run), {r.tree_size} nodes, "
                   f"${r.cost_usd:.4f}, {r.executor} executor, {r.seconds:.0f} s; stopped: {r.stopped_because}; "
                   "speedups re-measured against eager on one worker", style="dim")
    modules = [Text(f"module level of {m.capture}: " + (f"{m.best_candidate} ({_speedup(m.speedup_vs_eager)})"
                                                        if m.best_candidate else "no candidate")
                    + (f"; {m.template_note}" if m.template_note else "")) for m in r.modules]
    packing = [Text(f"pack both levels: modulelens pack {' '.join(r.pack_candidates)}")] if r.pack_candidates else []
    return Group(table, caption, *modules, *packing)


def _node_row(n: NodeLine) -> tuple[str | Cell, ...]:
    status = n.verdict or n.status
    what = f"v{n.variant}" if n.variant is not None else (n.provider or "")
    return (("  " * n.depth) + str(n.node) + (" *" if n.best else ""), Cell((status,), style=_VERDICT.get(status, "")),
            _speedup(n.speedup_vs_eager), seconds(n.latency_s) if n.latency_s else "-", n.candidate_id or "-", what,
            f"${n.cost_usd:.4f}" if n.cost_usd else "-", n.reason if n.verdict == "rejected" or n.status == "failed" else "")


def show_search_view(r: SearchSummary, wide: bool) -> RenderableType:
    parts: list[RenderableType] = [Text.assemble(("search ", "bold"), (r.search_id, "bold cyan"),
                                                 f": {r.settings.provider} provider, {r.settings.backend} backend, "
                                                 f"{r.executor} executor, {r.runs} run(s); stopped: {r.stopped_because or '-'}")]
    for t in r.targets:
        table = FittedTable([
            Column("node", "key"),
            Column("verdict", "value"),
            Column("vs eager", "value", justify="right"),
            Column("latency", "value", justify="right", drop=2),
            Column("candidate", "key"),
            Column("from", "value", drop=1),
            Column("cost", "value", justify="right", drop=0),
            Column("why", "text"),
        ], title=f"{t.target} {t.op}: best path {' > '.join(map(str, t.best_path))}", wide=wide)
        for n in t.nodes[1:]:
            table.add_row(*_node_row(n))
        parts.append(table)
    return Group(*parts)


def add_search_child_view(r: AddSearchChildResult, wide: bool) -> RenderableType:
    verdict = r.verdict or r.status
    head = Text.assemble((verdict, f"bold {_VERDICT.get(verdict, '')}".strip()),
                         f" node {r.node} of {r.search_id} ({r.target}), child of {r.parent}")
    rows: list[tuple[str, str | Cell]] = [("candidate", r.candidate_id or "-"), ("reason", r.reason or "-"),
                                          ("vs eager", _speedup(r.speedup_vs_eager)), ("report", r.report or "-")]
    rows += [("error", Cell((e,), style=_BAD)) for e in r.errors[:3]]
    return Group(head, kv_table(rows))


# --------------------------------------------------------------------------------------------
# Packs
# --------------------------------------------------------------------------------------------


def validate_module_view(r: ValidateModuleResult, wide: bool) -> RenderableType:
    return validate_kernel_view(r, wide)


def pack_view(r: PackResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("candidate", "key", style="cyan"),
        Column("kind", "value", drop=2),
        Column("target", "key"),
        Column("phase", "value", drop=3),
        Column("verdict", "value", drop=1),
        Column("speedup", "value", justify="right"),
        Column("shapes", "text", drop=4),
        Column("used", "value", drop=0),
    ], title=f"pack {r.ref}: {r.path} (sha256 {r.sha256[:12]}…)", wide=wide)
    for e in r.entries:
        table.add_row(e.candidate_id, e.kind, e.target, e.phase, Cell((e.verdict,), style=_VERDICT.get(e.verdict, "")),
                      _speedup(e.speedup_vs_eager), e.shape_rule or "exact", _yes_no(e.dispatched))
    return table


def _entries_table(entries: list[EntryReport], wide: bool, title: str) -> FittedTable:
    table = FittedTable([
        Column("candidate", "key", style="cyan"),
        Column("target", "key"),
        Column("hits", "value", justify="right"),
        Column("by phase", "value", drop=1),
        Column("fallbacks", "value", justify="right"),
        Column("why", "text", drop=0),
    ], title=title, wide=wide, stack=True)
    for e in entries:
        why = e.skip_reason or ", ".join(f"{reason} ({n})" for reason, n in e.fallback_reasons.items()) or "-"
        phases = " ".join(f"{p[0]}{n}" for p, n in sorted(e.hits_by_phase.items(), reverse=True)) or "-"
        table.add_row(e.candidate_id, e.target, str(e.hits), phases, str(e.fallbacks), why)
    return table


def run_view(r: RunResult, wide: bool) -> RenderableType:
    rows: list[tuple[str, str | Cell]] = [
        ("summary", Cell((r.summary,), style=_GOOD if r.hits else _BAD)),
        ("exit code", Cell((str(r.exit_code),), style=_GOOD if r.exit_code == 0 else _BAD)),
        ("calls", f"{r.hits} to pack kernels, {r.fallbacks} fell back to eager ({r.mechanism})"),
        ("steps", f"{r.steps} ({r.step_kind})"),
    ]
    if r.step_seconds_with is not None:
        rows.append(("step time", seconds(r.step_seconds_with) + " with the pack"
                     + (f", {seconds(r.step_seconds_without)} without" if r.step_seconds_without is not None else "")))
    if r.timing_status is not None:
        rows.append(("step ratio", _measured(r.step_ratio, r.step_ratio_interval, r.timing_status)
                     + f": {r.timing_reason}"))
    if r.outputs_match is not None:
        rows.append(("outputs", _yes_no(r.outputs_match)))
    if r.script_error:
        rows.append(("error", Cell((r.script_error,), style=_BAD)))
    rows += [("warning", Cell((w,), style=_WARN)) for w in r.warnings]
    return Group(kv_table(rows, title="run with a pack"), _entries_table(r.entries, wide, "entries"))


def check_pack_view(r: CheckPackResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("capture", "key", style="cyan"),
        Column("matches", "value"),
        Column("max abs err", "value", justify="right", drop=1),
        Column("hits", "value", justify="right"),
        Column("fallbacks", "value", justify="right", drop=2),
        Column("speedup", "value", justify="right"),
        Column("detail", "text", drop=0),
    ], title=f"pack check ({'ok' if r.ok else 'NOT OK'}): {r.summary}", wide=wide)
    for c in r.checks:
        table.add_row(c.capture, _yes_no(c.matches_captured and c.matches_eager and c.grads_match is not False),
                      f"{c.max_abs_error:.3g}", str(c.hits), str(c.fallbacks),
                      _measured(c.speedup, c.speedup_interval, c.timing_status), c.detail or "-")
    notes = [Text(f"not hit: {x}", style=_BAD) for x in r.not_hit] + [Text(f"untested: {x}", style=_WARN)
                                                                      for x in r.untested]
    return Group(table, *notes)


# --------------------------------------------------------------------------------------------
# Statistics and skills
# --------------------------------------------------------------------------------------------


def _number_columns(*headers: tuple[str, int]) -> list[Column]:
    """Right-aligned optional number columns: (header, drop) each."""
    return [Column(header, "value", justify="right", drop=drop) for header, drop in headers]


def _findings_table(findings: list[StatsFinding], wide: bool) -> FittedTable:
    table = FittedTable([
        Column("kind", "key"),
        Column("module", "key"),
        Column("step", "value", justify="right", drop=0),
        Column("message", "text"),
        Column("action", "text"),
    ], title="findings", wide=wide, stack=True)
    for f in findings:
        table.add_row(Cell((f.kind,), style=_BAD if f.severity == "error" else _WARN), f.module or "(model)",
                      str(f.step), f.message, f.action)
    return table


def _types_table(r: GatherStatsResult, wide: bool) -> FittedTable:
    columns = [Column("type", "key"), *_number_columns(("modules", 0), ("act std", 4), ("zero frac", 3),
                                                       ("grad std", 2), ("update ratio", 1))]
    table = FittedTable(columns, title="by module type (last sampled step)", wide=wide)
    for row in r.by_type:
        table.add_row(row.type, str(row.modules), number(row.activation_std), number(row.activation_zero_frac),
                      number(row.gradient_std), number(row.update_ratio))
    return table


def _tensors_table(tensors: list[TensorStatsRow], wide: bool) -> FittedTable:
    columns = [Column("tensor", "key"), Column("group", "value", drop=2), Column("shape", "shrink", drop=6),
               *_number_columns(("mean", 8), ("std", 9), ("kurtosis", 3), ("zero frac", 7), ("min", 4), ("max", 5),
                                ("NaN/Inf", 1))]
    table = FittedTable(columns, title="tensors", wide=wide)
    for t in tensors:
        table.add_row(t.key, t.group, Cell((shape(t.shape),)), number(t.mean), number(t.std), number(t.kurtosis),
                      number(t.zero_frac), number(t.min), number(t.max), f"{t.nan or 0}/{t.inf or 0}")
    return table


def gather_stats_view(r: GatherStatsResult, wide: bool) -> RenderableType:
    what = (f": {r.modules} modules, {r.steps_sampled} sampled step(s) of {r.steps_seen}, order from {r.order_source}"
            if r.source == "script" else f": {len(r.tensors)} tensors of the capture")
    parts: list[RenderableType] = [Text.assemble(("statistics ", "bold"), (r.run_id, "bold cyan"), what)]
    parts.append(_findings_table(r.findings, wide) if r.findings else Text("no findings", style=_GOOD))
    if r.by_type:
        parts.append(_types_table(r, wide))
    if r.tensors:
        parts.append(_tensors_table(r.tensors, wide))
    parts += _notes(r.notes)
    parts.append(Text(f"report: {r.report_html or '-'}"))
    return Group(*parts)


def list_stats_runs_view(r: ListStatsRunsResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("run", "key", style="cyan"),
        Column("of", "key"),
        Column("modules", "value", justify="right", drop=1),
        Column("sampled steps", "value", justify="right", drop=2),
        Column("findings", "value", justify="right"),
        Column("created", "shrink", drop=0),
    ], title=f"statistics in {r.repo}", wide=wide)
    for x in r.runs:
        table.add_row(x.run_id, x.capture or x.script or "-", str(x.modules),
                      f"{x.steps_sampled} of {x.steps_seen}" if x.kind == "run" else "-", str(x.findings),
                      Cell((x.created_at, x.created_at[:16].replace("T", " "), x.created_at[:10])) if x.created_at else "-")
    return table


def show_stats_run_view(r: StatsRunView, wide: bool) -> RenderableType:
    e = r.entry
    what = (f": {len(r.modules)} modules over {len(r.steps)} sampled step(s), order from {r.order_source}"
            if e.kind == "run" else f": {len(r.tensors)} tensors of {e.capture}")
    parts: list[RenderableType] = [Text.assemble(("statistics ", "bold"), (e.run_id, "bold cyan"), what)]
    parts.append(_findings_table(r.findings, wide) if r.findings else Text("no findings", style=_GOOD))
    if r.tensors:
        parts.append(_tensors_table(r.tensors, wide))
    parts += _notes(r.notes)
    parts.append(Text(f"report: {r.report_html or '-'} (--json for the series)"))
    return Group(*parts)


def install_skills_view(r: InstallSkillsResult, wide: bool) -> RenderableType:
    table = FittedTable([Column("file", "key"), Column("status", "value")], title=f"skills installed in {r.target}",
                        wide=wide)
    styles = {"written": _GOOD, "unchanged": "dim", "skipped": _WARN}
    for status in ("written", "unchanged", "skipped"):
        for rel in getattr(r, status):
            table.add_row(rel, Cell((status,), style=styles[status]))
    return Group(table, Text("Next steps:\n" + r.next_steps))


# --------------------------------------------------------------------------------------------
# Lookup, and the view of anything else
# --------------------------------------------------------------------------------------------

_VIEWS: dict[type[BaseModel], View] = {
    CaptureModuleResult: capture_module_view,
    ShowCaptureResult: show_capture_view,
    CaptureSummary: capture_summary_view,
    ListOpsetsResult: list_opsets_view,
    ListCandidatesResult: list_candidates_view,
    CandidateView: show_candidate_view,
    ListStatsRunsResult: list_stats_runs_view,
    StatsRunView: show_stats_run_view,
    ListCapturesResult: list_captures_view,
    ReplayModuleResult: replay_module_view,
    ExportReproResult: export_repro_view,
    TagCaptureResult: tag_capture_view,
    OpSetSummary: cards_view,  # capture_ops, list of cards
    CardDetail: show_op_card_view,
    CardReplay: replay_op_card_view,
    ProfileResult: profile_view,
    GenerateKernelResult: generate_kernel_view,
    CandidateValidation: validate_kernel_view,
    SearchResult: optimize_view,
    SearchSummary: show_search_view,
    AddSearchChildResult: add_search_child_view,
    GatherStatsResult: gather_stats_view,
    InstallSkillsResult: install_skills_view,
    ValidateModuleResult: validate_module_view,
    PackResult: pack_view,
    RunResult: run_view,
    CheckPackResult: check_pack_view,
    TrustResult: trust_view,
    PushResult: push_view,
    PullResult: pull_view,
}


_VIEWS.update(REPO_VIEWS)


def view_for(result_type: type[BaseModel]) -> View | None:
    """The view of this result model, or of the nearest base model that has one."""
    for cls in result_type.__mro__:
        if cls in _VIEWS:
            return _VIEWS[cls]
    return None


# Result fields cut by a request field of their own; any other list is cut by ``top`` or ``limit``.
_CUT_BY = {"steps": "points", "source": "source_lines"}


def _cut_option(field: str, request: type[BaseModel]) -> str | None:
    """The option of ``request`` that decides how much of the result list ``field`` is shown."""
    names = [_CUT_BY.get(field.rsplit(".", 1)[-1], ""), "top", "limit"]
    name = next((n for n in names if n in request.model_fields), None)
    return None if name is None else "--" + name.replace("_", "-")


def left_out_notes(result: BaseModel, request: type[BaseModel]) -> list[RenderableType]:
    """One line under the tables for each list ``result`` cut short (its ``left_out``): how many
    items were not shown, the option of ``request`` that shows more, and where the full data is."""
    notes: list[RenderableType] = []
    for cut in getattr(result, "left_out", None) or []:
        option = _cut_option(cut.field, request)
        more = f"{option} N to see more; " if option else ""
        notes.append(Text(f"{cut.total - cut.shown} more {cut.field} not shown ({more}full data: {cut.full})",
                          style="dim"))
    return notes


def _value_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float, bool)) or v is None for v in value):
        return ", ".join("-" if v is None else str(v) for v in value) or "[]"
    return json.dumps(value, separators=(",", ":"), default=str)


def _records_table(name: str, records: list[dict[str, Any]], wide: bool) -> FittedTable:
    keys: list[str] = []
    for row in records:
        keys.extend(k for k in row if k not in keys)
    table = FittedTable([Column(k, "text") for k in keys], title=name, wide=wide)
    for row in records:
        table.add_row(*(_value_cell(row.get(k)) for k in keys))
    return table


def generic_view(result: BaseModel, wide: bool) -> RenderableType:
    """One row per field; lists of records as their own tables below (``left_out`` is said by
    :func:`left_out_notes`)."""
    rows: list[tuple[str, str | Cell]] = []
    tables: list[RenderableType] = []
    for name, value in result.model_dump(mode="json", exclude={"left_out", "warnings", "next"}).items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.append(_records_table(name, value, wide))
        else:
            rows.append((name, _value_cell(value)))
    return Group(kv_table(rows), *tables)
