"""How the CLI shows captures, operator cards and profiles (see :mod:`modulelens.cli.views`)."""

from __future__ import annotations

import json
import re

from rich.console import Group, RenderableType
from rich.text import Text

from modulelens.capture import CaptureSummary, TensorInfo
from modulelens.cli.formats import dtypes_cell, list_cell, number, percent, seconds, shape, shapes_cell
from modulelens.cli.stats_views import tensors_table
from modulelens.cli.styles import BAD, GOOD, WARN, notes, yes_no
from modulelens.cli.tables import Cell, Column, FittedTable, kv_table
from modulelens.ops import CardDetail, CardReplay, OpSetSummary
from modulelens.profiling.targets import ProfileResult
from modulelens.tools.capture_module import CaptureModuleResult
from modulelens.tools.export_repro import ExportReproResult
from modulelens.tools.lists import ListCapturesResult, ListOpsetsResult
from modulelens.tools.replay_module import ReplayModuleResult, TensorMatch
from modulelens.tools.show import ShowCaptureResult
from modulelens.tools.tag_capture import TagCaptureResult

__all__ = ["CAPTURE_VIEWS"]


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
        rows.append(("activations", Cell((f"{s.activations.mode}: {s.activations.reason}",), style=WARN)))
    if s.backward:
        rows.append(("backward", "gradients captured"))
    if s.rank is not None:
        rows.append(("rank", f"{s.rank} of {s.world_size}"))
    rows += [("unrecorded", Cell((u,), style=WARN)) for u in s.unrecorded]
    rows += [("note", Cell((n,), style=WARN)) for n in s.notes]
    rows.append(("path", s.path))
    return kv_table(rows, title=title or s.ref)


def show_capture_view(r: ShowCaptureResult, wide: bool) -> RenderableType:
    parts: list[RenderableType] = [capture_summary_view(r, wide)]
    if r.tensors:
        parts.append(tensors_table(r.tensors, wide))
    return Group(*parts, *notes(r.tensor_notes))


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
                      yes_no(o.allclose))

    for o in r.outputs + r.state + (r.backward or []):
        add(o)
    verdict = (Text("exact match", style=GOOD) if r.exact else Text("match", style=GOOD) if r.match
               else Text("not compared", style=WARN) if not r.compared else Text("MISMATCH", style=BAD))
    judged = f", {r.tolerance_dtype}'s" if r.tolerance_dtype else ""
    summary = Text.assemble(verdict, f" (rtol {r.rtol:g}, atol {r.atol:g}{judged}); rebuild {r.reconstruction_seconds * 1e3:.1f} ms, "
                            f"run {r.run_seconds * 1e3:.1f} ms on {r.device}"
                            + ("; inputs synthesised" if r.synthesized_inputs else ""))
    failed = [Text(f"{a.strategy} failed: {a.error}", style=WARN) for a in r.attempts]
    return Group(table, summary, *failed, *notes(r.notes))


def export_repro_view(r: ExportReproResult, wide: bool) -> RenderableType:
    check = ("not run" if r.verified is None else Cell(("reproduces the capture",), style=GOOD) if r.verified
             else Cell(("did not reproduce",), style=BAD))
    rows: list[tuple[str, str | Cell]] = [("file", r.path), ("flavor", r.flavor), ("data", r.data_dir), ("check", check)]
    if r.max_abs_error is not None:
        rows.append(("max abs error", number(r.max_abs_error)))
    rows += [("skipped", s) for s in r.skipped]
    return kv_table(rows, title=f"repro of {r.ref}")


def tag_capture_view(r: TagCaptureResult, wide: bool) -> RenderableType:
    name = r.ref.rpartition(":")[0]
    return Text(f"{name}@{r.tag} -> {r.ref}" + (f" (was {r.previous})" if r.previous else ""))




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
    return Group(table, caption, *notes(r.notes))


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
    verdict = (Text("exact match", style=GOOD) if r.exact else Text("match", style=GOOD) if r.match
               else Text("MISMATCH", style=BAD))
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
    rows += [("note", Cell((n,), style=WARN)) for n in r.notes]
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


CAPTURE_VIEWS = {
    CaptureSummary: capture_summary_view,
    ShowCaptureResult: show_capture_view,
    CaptureModuleResult: capture_module_view,
    ListCapturesResult: list_captures_view,
    ReplayModuleResult: replay_module_view,
    ExportReproResult: export_repro_view,
    TagCaptureResult: tag_capture_view,
    OpSetSummary: cards_view,
    ListOpsetsResult: list_opsets_view,
    CardDetail: show_op_card_view,
    CardReplay: replay_op_card_view,
    ProfileResult: profile_view,
}
