"""The UI's pages. Each one gets its data from tools of the registry (no product logic here),
shapes it for its template, and renders it. Errors (unknown references, invalid names) become the
error page through the app's exception handler."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse

from modulelens.errors import ModuleLensError
from modulelens.ui.render import repo_file
from modulelens.ui.sections import section
from modulelens.ui.state import ui_state
from modulelens.ui.tree import ParamLeaf, module_tree, search_tree

TENSOR_GROUPS = ("input", "output", "weight", "gradient")
# What a search page shows of each node's stored validation report.
REPORT_FIELDS = ("flags", "speedup_interval", "timing_status", "timing_reason")
# The statistics the training-statistics page can plot (per module and per type, over steps).
PLOTTED_STATS = ["std", "zero_frac", "mean", "rms", "kurtosis", "gain", "min", "max", "sat_frac", "entropy", "max_prob",
                 "onehot_frac"]


def captures_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    listing = ui.call("list", kind="captures")
    return ui.page("captures.html", "captures", title="Captures", captures=listing.captures)


def capture_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    summary = ui.call("show", kind="captures", ref=request.path_params["ref"], tensors=True)
    opsets = ui.call("list", kind="opsets", of=summary.ref).opsets
    weights = [ParamLeaf(t.key, t.shape, t.dtype) for t in summary.tensors if t.group == "weight"]
    groups = {g: [t for t in summary.tensors if t.group == g] for g in TENSOR_GROUPS}
    return ui.page("capture.html", "captures", title=summary.ref, capture=summary, opsets=opsets,
                   tree=module_tree(summary.module_path, summary.class_path, weights), groups=groups,
                   tensor_notes=summary.tensor_notes)


def opsets_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    return ui.page("opsets.html", "cards", title="Operator cards", opsets=ui.call("list", kind="opsets").opsets)


def opset_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    cards = ui.call("list", kind="cards", of=request.path_params["ref"])
    candidates = ui.call("list", kind="candidates").candidates
    candidates_of: dict[str, list[Any]] = {}
    for c in candidates:
        if c.card_id:  # module and broken candidates belong to no card
            candidates_of.setdefault(c.card_id, []).append(c)
    return ui.page("opset.html", "cards", title=f"Cards of {cards.opset}", cards=cards,
                   candidates_of=candidates_of)


def candidates_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    return ui.page("candidates.html", "candidates", title="Candidates",
                   candidates=ui.call("list", kind="candidates").candidates)


def candidate_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    view = ui.call("show", kind="candidates", ref=request.path_params["ref"])
    return ui.page("candidate.html", "candidates", title=view.entry.candidate_id, view=view,
                   source_url=repo_file(view.source_path, ui.settings.repo_root))


def stats_runs_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    return ui.page("stats_runs.html", "stats", title="Training statistics", runs=ui.call("list", kind="stats").runs)


def stats_run_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    view = ui.call("show", kind="stats", ref=request.path_params["ref"], stats=PLOTTED_STATS)
    root = ui.settings.repo_root
    return ui.page("stats_run.html", "stats", title=view.entry.run_id, view=view,
                   plot_data=view.model_dump(mode="json", include={"steps", "modules", "types", "findings"}),
                   report_html=repo_file(view.report_html, root), report_png=repo_file(view.report_png, root))


def searches_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    searches = [e.model_dump(mode="json") for e in ui.call("list", kind="searches").searches]
    return ui.page("searches.html", "searches", title="Searches", searches=searches)


def _report_facts(ui: Any, ref: str) -> dict[str, Any]:
    """The flags and timing of the stored report ``ref`` (nothing when it cannot be read)."""
    try:
        report = ui.call("show", kind="reports", ref=ref).model_dump(mode="json")
    except ModuleLensError:
        return {}
    return {k: report[k] for k in REPORT_FIELDS if report.get(k) is not None}


def search_page(request: Request) -> HTMLResponse:
    """One search: per target, the best result and the tree, each node with its verdict, speedup
    (interval when timed that way) and the flags of its report; continue and stop."""
    ui = ui_state(request)
    search = ui.call("show", kind="searches", ref=request.path_params["ref"]).model_dump(mode="json")
    facts: dict[str, dict[str, Any]] = {}
    for target in search["targets"]:
        for node in target["nodes"]:
            ref = node.get("report")
            if ref and ref not in facts:
                facts[ref] = _report_facts(ui, ref)
            node.update({k: v for k, v in facts.get(ref or "", {}).items() if node.get(k) in (None, [], "")})
            node.setdefault("flags", [])
        target["tree"] = search_tree(target["nodes"])
    return ui.page("search.html", "searches", title=search["search_id"], search=search)


def packs_page(request: Request) -> HTMLResponse:
    """The stored packs: each with its entries (phase, shape rule, used or not), the hits of its last
    run per phase and of its last check."""
    ui = ui_state(request)
    packs = ui.call("list", kind="packs").packs
    entries: dict[str, list[Any]] = {}
    for p in packs:
        try:
            entries[p.ref] = ui.call("show", kind="packs", ref=p.ref).entries
        except ModuleLensError:  # listed but unreadable now (removed meanwhile): shown without its entries
            entries[p.ref] = []
    return ui.page("packs.html", "packs", title="Packs", packs=packs, entries=entries)


def list_section_page(request: Request) -> HTMLResponse:
    """A list-backed section: the ``list`` tool's result for its kind, or "none yet" while the
    repository holds none."""
    ui = ui_state(request)
    s = section(request.url.path.strip("/"))
    listed = ui.call("list", kind=s.list_kind).model_dump(mode="json", exclude={"next", "repo", "kind"})
    result = listed if listed.get(s.list_kind) else None
    return ui.page("section.html", s.key, title=s.title, section=s, result=result)


def jobs_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    return ui.page("jobs.html", "jobs", title="Jobs")
