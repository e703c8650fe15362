"""The web UI on a real repository: the example's capture, its operator cards, a validated
candidate kernel and a training-statistics run (built once for this module through the CLI).

First through Starlette's TestClient (every page shows the real content), then in a real browser:
headless Chromium from Debian's ``chromium`` package (the set-up installs it with apt-get when it
is missing, and skips with the reason when it cannot), driven by playwright for Python pointed at
that Chromium (no ``playwright install``). The browser opens each page, checks what it shows,
clicks a replay and waits for its result, and saves a screenshot of each page under
``$MODULELENS_UI_SCREENSHOTS`` (default: a pytest temporary folder, printed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from click.testing import CliRunner

from conftest import EXAMPLES, ROOT, TRAIN

pytestmark = pytest.mark.slow

FAULTS = EXAMPLES / "faults" / "train.py"


@dataclass(frozen=True)
class DemoRepo:
    root: Path
    capture: str
    opset: str
    softmax_card: str
    candidate: str
    stats_run: str
    search: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory, app) -> DemoRepo:
    root = tmp_path_factory.mktemp("ui-demo-repo")
    runner = CliRunner()

    def run(*args) -> dict:
        r = runner.invoke(app, [str(a) for a in args])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    ops = run("capture-ops", TRAIN, "--module", "blocks.1", "--top", "100", "--repo", root, "--json", "--", "--steps", "2")
    softmax = next(c["card_id"] for c in ops["cards"] if c["op"] == "aten._safe_softmax.default")
    gen = run("generate-kernel", softmax, "--backend", "cpp", "--repo", root, "--json")
    report = run("validate-kernel", gen["candidate_id"], "--repo", root, "--json")
    assert report["verdict"] == "custom", report["reason"]
    stats = run("gather-stats", FAULTS, "--every", "5", "--repo", root, "--json", "--",
                "--fault", "dead-relu", "--module", "blocks.2.act", "--steps", "20")
    search = _search_of(root, softmax, gen["candidate_id"])
    return DemoRepo(root, ops["capture"], ops["opset"], softmax, gen["candidate_id"], stats["run_id"], search)


def _search_of(root: Path, card: str, candidate: str) -> str:
    """A search over the demo's softmax card whose one child is the demo's validated candidate (with
    its real report), written through the search store: a real optimize run costs a minute here and
    is tested in test_search.py; continuing this one from the page runs the real optimize."""
    from modulelens.registry import ToolContext
    from modulelens.repo import Repository
    from modulelens.search.model import NodeRecord, SearchManifest, SearchSettings, TargetOutcome
    from modulelens.search.store import save_search, search_key, write_node
    from modulelens.search.targets import resolve_targets
    from modulelens.tools import get_tool

    repo, settings = Repository(root), SearchSettings(max_evals=1)
    (target,) = resolve_targets(repo, [card], settings, 3)
    show = get_tool("show")
    view = show(show.request(kind="candidate", ref=candidate), ToolContext(repo_root=root))
    report = view.report
    save_search(repo, SearchManifest(
        search_id="opt-demo", key=search_key([target], settings), settings=settings, targets=[target],
        stopped_because="max_evals", outcome=[TargetOutcome(
            target=target.card_id, op=target.op, best_candidate=candidate, best_node=1, evaluations=1, nodes=1,
            speedup_vs_eager=report.speedup_vs_eager, stopped_because="max_evals")]))
    write_node(repo, "opt-demo", 0, NodeRecord(node=0, status="root"))
    write_node(repo, "opt-demo", 0, NodeRecord(
        node=1, parent=0, lineage=[0], status="evaluated", candidate_id=candidate, verdict=report.verdict,
        correct=report.correct, speedup_vs_eager=report.speedup_vs_eager, report=view.entry.report,
        provider="template", variant=0))
    return "opt-demo"


def _pages(d: DemoRepo) -> list[tuple[str, str]]:
    return [("captures", "/"), ("capture", f"/captures/{d.capture}"), ("opsets", "/cards"),
            ("cards", f"/cards/{d.opset}"), ("candidates", "/candidates"), ("candidate", f"/candidates/{d.candidate}"),
            ("stats_runs", "/stats"), ("stats_run", f"/stats/{d.stats_run}"), ("searches", "/searches"),
            ("search", f"/searches/{d.search}"), ("packs", "/packs"), ("jobs", "/jobs")]


def test_every_page_shows_real_content(demo):
    from modulelens.ui.app import build_app
    from modulelens.ui.state import UiSettings

    expected = {
        "captures": ["blocks.1", "model:Block", "source, export"],
        "capture": ["data-captured", "attn.qkv.weight", "args.0", "8×32×64", demo.opset],
        "opsets": [demo.opset, demo.capture],
        "cards": ["aten._safe_softmax.default", "aten.addmm.default", "kind-compute", "roofline", demo.candidate],
        "candidates": [demo.candidate, "verdict-custom", "softmax"],
        "candidate": ["verdict-custom", "tok-kw", "forward", "output 0 values (captured sample 0)"],
        "stats_runs": [demo.stats_run.split(":")[0], "faults/train.py", "badge-bad"],
        "stats_run": ["dead_activation", "blocks.2.act", 'id="stats-data"', "report.html"],
        "searches": [demo.search, demo.softmax_card], "search": ['data-node="1"', "aten._safe_softmax.default"],
        "packs": ["None yet."], "jobs": ["data-jobs-table"],
    }
    app = build_app(UiSettings(repo_root=demo.root, project_root=ROOT))
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        for name, path in _pages(demo):
            r = c.get(path)
            assert r.status_code == 200, (path, r.text[-2000:])
            for text in expected[name]:
                assert text in r.text, (name, text)
            if name == "candidates":  # a speedup, or why there is none (a loaded machine)
                assert "×" in r.text or "undetermined" in r.text, r.text[-2000:]
        page = c.get(f"/stats/{demo.stats_run}").text
        data = json.loads(page.split('id="stats-data">')[1].split("</script>")[0])
        assert [m["name"] for m in data["modules"]][:3] == ["", "inp", "blocks.0"]
        assert any(f["module"] == "blocks.2.act" for f in data["findings"])


def test_the_read_only_tools_behind_the_pages(demo, cli):
    """The tools the pages read through, from the CLI (the same results over MCP)."""
    r = demo.root
    code, opsets, out = cli("list", "opsets", demo.capture, "--repo", r, "--json")
    assert code == 0, out.output
    assert [(o["ref"], o["capture"], o["cards"] > 5) for o in opsets["opsets"]] == [(demo.opset, demo.capture, True)]
    code, roof, out = cli("list", "cards", demo.opset, "--limit", "100", "--repo", r, "--json")
    assert code == 0 and roof["copy_bytes_per_s"] > 0, out.output
    by_kind = {c["kind"]: c for c in roof["cards"]}
    assert by_kind["memory"]["roofline_fraction"] > 0 and by_kind["compute"]["roofline_fraction"] is None
    code, tensors, out = cli("show", "capture", demo.capture, "--tensors", "--repo", r, "--json")
    assert code == 0, out.output
    groups = {t["group"] for t in tensors["tensors"]}
    assert groups == {"input", "output", "weight"} and all(t["std"] is not None for t in tensors["tensors"])
    code, cands, out = cli("list", "candidates", demo.softmax_card, "--repo", r, "--json")
    assert code == 0, out.output
    (entry,) = cands["candidates"]
    assert (entry["candidate_id"], entry["verdict"], entry["reports"]) == (demo.candidate, "custom", 1)
    assert entry["speedup_vs_eager"] is None or entry["speedup_vs_eager"] > 0  # null when undetermined
    code, view, out = cli("show", "candidate", demo.candidate, "--full", "--repo", r, "--json")
    assert code == 0 and "forward" in view["source"] and view["report"]["verdict"] == "custom", out.output
    code, runs, out = cli("list", "stats", "--repo", r, "--json")
    assert code == 0 and [x["run_id"] for x in runs["runs"]] == [demo.stats_run], out.output
    code, run, out = cli("show", "stats", demo.stats_run, "--stats", "std", "--top", "100", "--points", "2000", "--repo", r, "--json")
    assert code == 0, out.output
    assert {f["module"] for f in run["findings"]} == {"blocks.2.act"}
    assert all(set(m["activation"]) <= {"std"} for m in run["modules"]) and len(run["steps"]) == 4
    code, _, out = cli("show", "candidate", "nope:v1", "--repo", r)
    assert code == 2 and "no candidate named" in out.output


# --------------------------------------------------------------------------------------------
# In a real browser
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium, installed with apt-get when missing (skips with the reason otherwise)."""
    path = shutil.which("chromium")
    if path is None and shutil.which("apt-get"):
        for cmd in (["apt-get", "install", "-y", "chromium"], ["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
            try:
                subprocess.run(cmd, capture_output=True, timeout=900, check=False)
            except (OSError, subprocess.TimeoutExpired):
                break
            path = shutil.which("chromium")
            if path:
                break
    if path is None:
        pytest.skip("headless Chromium is missing and `apt-get install -y chromium` could not install it "
                    "(it needs root and the Debian archive)")
    return path


@pytest.fixture(scope="module")
def browser_page(chromium):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(15_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        yield page, errors
        browser.close()


@pytest.fixture(scope="module")
def server(demo):
    from modulelens.ui.server import UiServer

    with UiServer(demo.root, port=0, project_root=ROOT) as srv:
        yield srv


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("MODULELENS_UI_SCREENSHOTS") or tmp_path_factory.mktemp("ui-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nUI screenshots in {folder}")
    return folder


def test_each_page_in_chromium(demo, server, browser_page, shots):
    page, errors = browser_page
    base = server.url.rstrip("/")
    checks = {
        "captures": lambda: page.locator("#captures").get_by_role("link", name="blocks.1").is_visible(),
        "capture": lambda: "Block" in page.locator("[data-captured]").first.inner_text()
        and page.locator("#tensors").get_by_text("attn.qkv.weight").is_visible(),
        "opsets": lambda: page.locator("#opsets").get_by_text(demo.capture).is_visible(),
        "cards": lambda: page.locator("#cards svg.roofline").count() > 0
        and page.locator("#cards").get_by_text("aten._safe_softmax.default").is_visible(),
        "candidates": lambda: page.locator("#candidates .verdict-custom").first.is_visible(),
        "candidate": lambda: page.locator("#validation .verdict-custom").is_visible()
        and page.locator("#source .tok-kw").count() > 10,
        "stats_runs": lambda: page.locator("#runs").get_by_role("link").first.is_visible(),
        "stats_run": lambda: page.locator('svg[data-plot="steps"] path.series').count() >= 10
        and page.locator('svg[data-plot="depth"] .finding-mark').count() >= 1,
        "searches": lambda: page.locator("#searches").get_by_role("link", name=demo.search).is_visible(),
        "search": lambda: page.locator('.search-node[data-node="1"] .verdict').first.is_visible(),
        "packs": lambda: page.get_by_text("None yet.").is_visible(),
        "jobs": lambda: page.locator("[data-jobs-table]").is_visible(),
    }
    for name, path in _pages(demo):
        page.goto(base + path)
        page.wait_for_load_state("load")
        assert checks[name](), f"{name} ({path}) does not show its content"
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    # A finding links to its module: the module's row and line get selected.
    page.goto(f"{base}/stats/{demo.stats_run}")
    page.locator("#findings a.module-link", has_text="blocks.2.act").click()
    assert "selected" in (page.locator('[data-module-row="blocks.2.act"]').get_attribute("class") or "")
    assert not errors, errors


def test_replay_from_the_capture_page(demo, server, browser_page, shots):
    page, errors = browser_page
    page.goto(f"{server.url.rstrip('/')}/captures/{demo.capture}")
    page.locator("#replay select[name=strategy]").select_option("source")
    page.locator("#replay button[type=submit]").click()
    done = page.locator('#replay [data-job-state="done"], #replay [data-job-state="failed"]')
    done.wait_for(timeout=90_000)
    text = done.inner_text()
    assert "exact" in text and "strategy source" in text, text
    assert page.locator("#jobs-panel .state-done").first.is_visible()
    page.screenshot(path=str(shots / "capture_replayed.png"), full_page=True)
    assert not errors, errors


def test_a_search_page_continues_its_search_as_a_job_and_stops_it(demo, server, browser_page, shots):
    page, errors = browser_page
    base = server.url.rstrip("/")
    page.goto(base + "/searches")
    page.locator("#searches").get_by_role("link", name=demo.search).click()
    page.wait_for_url(f"**/searches/{demo.search}")
    node = page.locator('.search-node[data-node="1"]')
    assert node.locator(".verdict").inner_text() in ("custom", "wrapper", "rejected")
    assert "×" in node.locator(".node-speedup").inner_text() or "undetermined" in node.inner_text()
    assert page.locator('.search-node[data-node="0"]').get_by_text("eager (the root)").is_visible()
    page.locator("#search-controls input[name=more]").fill("2")
    page.locator("#search-controls button[type=submit]").click()
    running = page.locator('#search-controls [data-job-state="running"]')
    running.wait_for(timeout=30_000)
    assert "running" in running.inner_text()
    page.screenshot(path=str(shots / "search_continuing.png"), full_page=True)
    running.get_by_role("button", name="Stop").click()
    page.locator('#search-controls [data-job-state="stopped"]').wait_for(timeout=60_000)
    assert not errors, errors


def test_validate_again_shows_the_new_report_without_a_reload(demo, server, browser_page, shots):
    page, errors = browser_page
    page.goto(f"{server.url.rstrip('/')}/candidates/{demo.candidate}")
    validation = page.locator("#validation")
    before = validation.locator("tr", has_text="report").inner_text()
    page.evaluate("window.__notReloaded = true")
    validation.get_by_role("button", name="Validate again").click()
    # the section is replaced with the new report (one more validation) once the job is done
    page.locator("#validation tr", has_text="validations)").filter(has_not_text=before).wait_for(timeout=120_000)
    after = page.locator("#validation").locator("tr", has_text="report").inner_text()
    assert after != before and page.evaluate("window.__notReloaded === true")
    page.locator('#validation [data-job-state="done"]').wait_for(timeout=10_000)  # its status line is back
    page.screenshot(path=str(shots / "candidate_validated_again.png"), full_page=True)
    assert not errors, errors


def test_a_chart_of_more_than_eight_module_types_gets_a_legend_that_scrolls(browser_page, tmp_path, shots):
    """Thirty module types: the legend is a scrolling list under the chart, an entry selects its line."""
    from modulelens.repo import Repository
    from modulelens.ui.server import UiServer

    types = {f"Type{i:02d}": {"modules": [f"m{i}"], "activation": {"std": [1.0 + i, 2.0 + i]}, "gradient": {}}
             for i in range(30)}

    def write(folder: Path) -> dict:
        (folder / "series.json").write_text(json.dumps({
            "steps": [0, 10], "order": [f"m{i}" for i in range(30)], "types": types, "definitions": {},
            "modules": {f"m{i}": {"type": f"Type{i:02d}", "index": i, "activation": {"std": [1.0, 2.0]},
                                  "gradient": {}} for i in range(30)}}))
        (folder / "findings.json").write_text("[]")
        return {"source": {"kind": "script", "script": "train.py", "argv": []},
                "summary": {"kind": "run", "modules": 30, "steps_seen": 11, "steps_sampled": 2, "every": 10,
                            "order_source": "observed", "findings": 0, "report_files": []}}

    ref = Repository(tmp_path / "repo").create("stats", "many", write).ref
    page, errors = browser_page
    with UiServer(tmp_path / "repo", port=0, project_root=tmp_path) as srv:
        page.goto(f"{srv.url.rstrip('/')}/stats/{ref}")
        legend = page.locator('svg[data-plot="types"] + ul.legend-list')
        assert legend.locator("li").count() == 30 and legend.is_visible()
        assert legend.evaluate("e => e.scrollHeight > e.clientHeight")  # it scrolls
        legend.locator('li[data-legend="Type07"]').click()
        assert "selected" in (page.locator('ul.legend-list li[data-legend="Type07"]').get_attribute("class") or "")
        assert page.locator('svg[data-plot="types"] path.series.selected[data-series="Type07"]').count() == 1
        page.screenshot(path=str(shots / "stats_many_types.png"), full_page=True)
    assert not errors, errors


def test_the_jobs_page_shows_jobs_an_agent_started_with_subject_outcome_link_and_progress(browser_page, tmp_path, shots):
    """Jobs recorded as start_job records them (tool and arguments only): in Chromium each row names
    its tool and main argument, a finished one says what it came to and links to its page, a running
    one without a reported total reads "running, N s" instead of an empty bar."""
    from modulelens.jobs import JobTable
    from modulelens.jobs.table import now_iso, write_record
    from modulelens.ui.server import UiServer

    repo = tmp_path / "repo"
    table = JobTable(repo)
    table.attach("profile", {"target": "scale"})  # running, owned by this process
    done = table.attach("validate_kernel", {"target": "blk/3", "source": "k.cpp"})
    write_record(done, table.get(done.stem).model_copy(update={
        "state": "done", "ended_at": now_iso(), "owner": "",
        "result": {"verdict": "custom", "reason": "correct; faster than eager", "speedup_vs_eager": 1.8,
                   "candidate_id": "blk.card3:v2"}}))
    page, errors = browser_page
    with UiServer(repo, port=0, project_root=tmp_path) as srv:
        page.goto(f"{srv.url.rstrip('/')}/jobs")
        row = page.locator(f'tr[data-job="{done.stem}"]')
        row.wait_for(timeout=10_000)
        assert "validate_kernel blk/3" in row.inner_text() and "custom: correct; faster than eager" in row.inner_text()
        assert row.locator("a").get_attribute("href") == "/candidates/blk.card3%3Av2"
        running = page.locator("tr[data-job^='profile-']")
        assert "profile scale" in running.inner_text() and "running, " in running.inner_text()
        assert running.locator("progress").count() == 0  # no bar without a fraction
        page.screenshot(path=str(shots / "jobs_started_elsewhere.png"), full_page=True)
    assert not errors, errors
