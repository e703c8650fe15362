"""How the CLI shows kernels, their validation, searches, packs and runs (see :mod:`modulelens.cli.views`)."""

from __future__ import annotations

import json

from rich.console import Group, RenderableType
from rich.text import Text

from modulelens.cli.formats import percent, seconds, speedup
from modulelens.cli.styles import BAD, GOOD, VERDICT_STYLE, WARN, verdict_cell, yes_no
from modulelens.cli.tables import Cell, Column, FittedTable, kv_table
from modulelens.dispatch.runtime import EntryReport
from modulelens.search.model import SearchResult
from modulelens.search.summary import NodeLine, SearchSummary
from modulelens.tools.add_search_child import AddSearchChildResult
from modulelens.tools.check_pack import CheckPackResult
from modulelens.tools.generate_kernel import GenerateKernelResult
from modulelens.tools.lists import ListCandidatesResult
from modulelens.tools.pack import PackResult
from modulelens.tools.pull import PullResult
from modulelens.tools.push import PushResult
from modulelens.tools.run import RunResult
from modulelens.tools.trust_artifact import TrustResult
from modulelens.tools.validate_kernel import ValidateModuleResult
from modulelens.validation import CandidateValidation, CandidateView

__all__ = ["KERNEL_VIEWS"]


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
        rows.append(("validation", Cell((f"{verdict}: {r.validation.get('reason', '')}",), style=VERDICT_STYLE.get(verdict, ""))))
    return kv_table(rows, title=f"generated {r.candidate_id}")



def _measured(point: float | None, interval: list[float] | None, status: str | None) -> str:
    """A speedup as reported: the point with its 95% interval, or undetermined with the interval."""
    span = f" (95% {interval[0]:.2f}x..{interval[1]:.2f}x)" if interval else ""
    if status == "ok" and point is not None:
        return f"{point:.2f}x{span}"
    return f"undetermined{span}" if status else "-"


def list_candidates_view(r: ListCandidatesResult, wide: bool) -> RenderableType:
    table = FittedTable([
        Column("candidate", "key", style="cyan"),
        Column("kind", "value"),
        Column("target", "key"),
        Column("op", "key"),
        Column("backend", "value", drop=2),
        Column("provider", "value", drop=0),
        Column("verdict", "value"),
        Column("speedup", "value", justify="right", drop=1),
    ], title=f"candidates in {r.repo}", wide=wide)
    for c in r.candidates:
        if c.kind == "broken":
            table.add_row(c.candidate_id, c.kind, "-", Cell((c.problem or "",), style=BAD), "-", "-",
                          Cell(("broken",), style=BAD), "-")
            continue
        table.add_row(c.candidate_id, c.kind, c.target, c.op or "-", c.backend or "-", c.provider or "-",
                      verdict_cell(c.verdict), speedup(c.speedup_vs_eager))
    return table


def show_candidate_view(r: CandidateView, wide: bool) -> RenderableType:
    e = r.entry
    rows: list[tuple[str, str | Cell]] = [
        (("card", f"{e.card_id} ({e.op}, {e.op_kind})") if e.kind == "card" else ("module", f"{e.target} ({e.op})")),
        ("backend", e.backend or "-"),
        ("provider", (e.provider or "-") + (f", template {e.family}" if e.family else "")),
    ]
    if e.parent:
        rows.append(("parent", e.parent))
    verdict = verdict_cell(e.verdict)
    rows.append(("verdict", Cell((f"{e.verdict}: {e.reason}",), style=verdict.style) if e.verdict else verdict))
    if e.speedup_vs_eager is not None:
        rows.append(("speedup", f"{speedup(e.speedup_vs_eager)} vs eager"))
    rows += [("report", f"{e.report} ({e.reports} stored)" if e.report else "-"), ("source", r.source_path)]
    return kv_table(rows, title=f"candidate {e.candidate_id}")


def checks_cell(r: CandidateValidation) -> Cell:
    """``29/49 passed; stage reached: done``, counted over every check the validation ran (a reply
    lists failed checks first and leaves the rest to ``left_out``: with more failures than it lists,
    the passed ones are counted as at most the rest)."""
    total = next((c.total for c in getattr(r, "left_out", []) if c.field == "checks"), len(r.checks))
    failed = sum(not c.passed for c in r.checks)
    every_failure_listed = failed < len(r.checks) or total == len(r.checks)
    passed = total - failed
    count = f"{passed}/{total}" if every_failure_listed else f"at most {passed}/{total}"
    return Cell((f"{count} passed; stage reached: {r.stage}",),
                style=GOOD if passed == total and total and every_failure_listed else WARN)


def validate_kernel_view(r: CandidateValidation, wide: bool) -> RenderableType:
    head = Text.assemble((r.verdict, f"bold {VERDICT_STYLE[r.verdict]}"), f" {r.candidate_id} for {r.target} ({r.backend})")
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
    rows.append(("checks", checks_cell(r)))
    rows += [("flag", Cell((f,), style=WARN)) for f in r.flags]
    rows += [("error", Cell((e,), style=BAD)) for e in (r.errors if wide else r.errors[:3])]
    rows.append(("report", r.report))
    parts: list[RenderableType] = [head, kv_table(rows)]
    shown = r.checks if wide else [c for c in r.checks if not c.passed]
    if shown:
        table = FittedTable([Column("check", "value"), Column("passed", "value"), Column("detail", "text")],
                            title="checks" if wide else "failed checks", wide=wide, stack=True)
        for c in shown:
            table.add_row(c.name, yes_no(c.passed), c.detail or "-")
        parts.append(table)
    return Group(*parts)


def trust_view(r: TrustResult, wide: bool) -> RenderableType:
    state = ("signed now: trusted" if r.signed else "trusted") if r.trusted or r.signed else "NOT trusted"
    rows: list[tuple[str, str | Cell]] = [("artifact", r.ref),
                                          ("state", Cell((state,), style=GOOD if r.trusted or r.signed else WARN))]
    rows += [("code file", f"{name}: {why}") for name, why in r.code_files.items()]
    rows += [("imports", path) for path in r.class_paths]
    rows += [("outside path", Cell((path,), style=BAD)) for path in r.escaping_paths]
    rows += [("checksum", Cell((problem,), style=BAD)) for problem in r.checksum_problems]
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
                                          ("state", Cell((state,), style=GOOD if r.trusted else WARN))]
    rows += [("path", r.path)] if r.path else []
    rows += [("tags", ", ".join(r.tags))] if r.tags else []
    rows += [("tags not set", "; ".join(r.tags_not_set))] if r.tags_not_set else []
    if r.next_step:
        rows.append(("next", r.next_step))
    return kv_table(rows, title=f"pulled {r.ref}")




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
        table.add_row(t.target, t.op, t.best_candidate or "-", speedup(t.speedup_vs_eager),
                      speedup(t.speedup_vs_compile), percent(t.roofline_fraction), str(t.evaluations),
                      t.stopped_because or "-")
    caption = Text(f"{r.evaluations} evaluations ({r.evaluations_this_run} in this run), {r.tree_size} nodes, "
                   f"${r.cost_usd:.4f}, {r.executor} executor, {r.seconds:.0f} s; stopped: {r.stopped_because}; "
                   "speedups re-measured against eager on one worker", style="dim")
    modules = [Text(f"module level of {m.capture}: " + (f"{m.best_candidate} ({speedup(m.speedup_vs_eager)})"
                                                        if m.best_candidate else "no candidate")
                    + (f"; {m.template_note}" if m.template_note else "")) for m in r.modules]
    packing = [Text(f"pack both levels: modulelens pack {' '.join(r.pack_candidates)}")] if r.pack_candidates else []
    return Group(table, caption, *modules, *packing)


def _node_row(n: NodeLine) -> tuple[str | Cell, ...]:
    status = n.verdict or n.status
    what = f"v{n.variant}" if n.variant is not None else (n.provider or "")
    return (("  " * n.depth) + str(n.node) + (" *" if n.best else ""), Cell((status,), style=VERDICT_STYLE.get(status, "")),
            speedup(n.speedup_vs_eager), seconds(n.latency_s) if n.latency_s else "-", n.candidate_id or "-", what,
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
    head = Text.assemble((verdict, f"bold {VERDICT_STYLE.get(verdict, '')}".strip()),
                         f" node {r.node} of {r.search_id} ({r.target}), child of {r.parent}")
    rows: list[tuple[str, str | Cell]] = [("candidate", r.candidate_id or "-"), ("reason", r.reason or "-"),
                                          ("vs eager", speedup(r.speedup_vs_eager)), ("report", r.report or "-")]
    rows += [("error", Cell((e,), style=BAD)) for e in r.errors[:3]]
    return Group(head, kv_table(rows))




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
        Column("shapes", "text"),
        Column("used", "value", drop=0),
    ], title=f"pack {r.ref}: {r.path} (sha256 {r.sha256[:12]}…)", wide=wide, stack=True)  # a rule on its own line
    for e in r.entries:
        table.add_row(e.candidate_id, e.kind, e.target, e.phase, Cell((e.verdict,), style=VERDICT_STYLE.get(e.verdict, "")),
                      speedup(e.speedup_vs_eager), e.shape_rule or "exact", yes_no(e.dispatched))
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
        ("summary", Cell((r.summary,), style=GOOD if r.hits else BAD)),
        ("exit code", Cell((str(r.exit_code),), style=GOOD if r.exit_code == 0 else BAD)),
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
        rows.append(("outputs", yes_no(r.outputs_match)))
    if r.script_error:
        rows.append(("error", Cell((r.script_error,), style=BAD)))
    rows += [("warning", Cell((w,), style=WARN)) for w in r.warnings]
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
        table.add_row(c.capture, yes_no(c.matches_captured and c.matches_eager and c.grads_match is not False),
                      f"{c.max_abs_error:.3g}", str(c.hits), str(c.fallbacks),
                      _measured(c.speedup, c.speedup_interval, c.timing_status), c.detail or "-")
    missed = [Text(f"not hit: {x}", style=BAD) for x in r.not_hit] + [Text(f"untested: {x}", style=WARN)
                                                                       for x in r.untested]
    return Group(table, *missed)


KERNEL_VIEWS = {
    GenerateKernelResult: generate_kernel_view,
    ListCandidatesResult: list_candidates_view,
    CandidateView: show_candidate_view,
    CandidateValidation: validate_kernel_view,
    TrustResult: trust_view,
    PushResult: push_view,
    PullResult: pull_view,
    SearchResult: optimize_view,
    SearchSummary: show_search_view,
    AddSearchChildResult: add_search_child_view,
    ValidateModuleResult: validate_module_view,
    PackResult: pack_view,
    RunResult: run_view,
    CheckPackResult: check_pack_view,
}
