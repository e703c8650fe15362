"""The UI's pages. Each one gets its data from tools of the registry (no product logic here),
shapes it for its template, and renders it. Errors (unknown references, invalid names) become the
error page through the app's exception handler."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse

from modulelens.ui.render import repo_file
from modulelens.ui.sections import section
from modulelens.ui.state import ui_state
from modulelens.ui.tree import ParamLeaf, module_tree

TENSOR_GROUPS = ("input", "output", "weight", "gradient")
# The statistics the training-statistics page can plot (per module and per type, over steps).
PLOTTED_STATS = ["std", "zero_frac", "mean", "rms", "kurtosis", "gain", "min", "max"]


def captures_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    listing = ui.call("list", kind="captures")
    return ui.page("captures.html", "captures", title="Captures", captures=listing.captures)


def capture_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    summary = ui.call("show", kind="capture", ref=request.path_params["ref"], tensors=True)
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
        candidates_of.setdefault(c.card_id, []).append(c)
    return ui.page("opset.html", "cards", title=f"Cards of {cards.opset}", cards=cards,
                   candidates_of=candidates_of)


def candidates_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    return ui.page("candidates.html", "candidates", title="Candidates",
                   candidates=ui.call("list", kind="candidates").candidates)


def candidate_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    view = ui.call("show", kind="candidate", ref=request.path_params["ref"])
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


def list_section_page(request: Request) -> HTMLResponse:
    """A list-backed section (searches, packs): the ``list`` tool's result for its kind, or "none
    yet" while the repository holds none."""
    ui = ui_state(request)
    s = section(request.url.path.strip("/"))
    listed = ui.call("list", kind=s.list_kind).model_dump(mode="json", exclude={"next", "repo", "kind"})
    result = listed if listed.get(s.list_kind) else None
    return ui.page("section.html", s.key, title=s.title, section=s, result=result)


def jobs_page(request: Request) -> HTMLResponse:
    ui = ui_state(request)
    return ui.page("jobs.html", "jobs", title="Jobs")
