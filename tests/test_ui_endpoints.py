"""The web UI's endpoints through Starlette's TestClient, on a small hand-written repository:
escaping of user text, path traversal, the token on a non-loopback bind, requests from other
sites, the limits on actions, the list-backed sections ("none yet" while empty), and jobs that run
a real tool in a child process (failing, and stopped while a script runs)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from modulelens.errors import ModuleLensError
from modulelens.repo import Repository
from modulelens.ui.app import build_app
from modulelens.ui.highlight import highlight
from modulelens.ui.security import bind_token, without_token
from modulelens.ui.state import UiSettings
from modulelens.ui.tree import ParamLeaf, module_tree

LOCAL = "http://127.0.0.1:8765"
XSS_MODULE = "<img src=x onerror=alert(1)>"
XSS_NOTE = '<script>alert("note")</script>'
XSS_FINDING_MODULE = "</script><script>alert(3)</script>"
SECRET = "top secret outside the repository"


def _tensor(key: str, shape: list[int]) -> dict:
    return {"$": "tensor", "key": key, "shape": shape, "dtype": "float32", "stored": False,
            "stats": {"mean": 0.0, "std": 1.0, "min": -2.0, "max": 2.0, "zero_fraction": 0.0}}


def _write_capture(folder: Path) -> dict:
    return {
        "module_path": f"enc.{XSS_MODULE}", "class_path": "evil_models:Evil<b>Class</b>", "strategies": [],
        "call_index": 1, "training": False,
        "inputs": {"args": {"$": "tuple", "items": [_tensor("args.0", [2, 3])]}, "kwargs": {"$": "dict", "items": []}},
        "outputs": _tensor("output", [2, 3]), "weights": {"lin.weight": _tensor("lin.weight", [3, 3])},
        "notes": [XSS_NOTE],
    }


def _write_stats(folder: Path) -> dict:
    (folder / "series.json").write_text(json.dumps({
        "steps": [0, 10], "order": ["lin", XSS_FINDING_MODULE],
        "modules": {"lin": {"type": "Linear", "index": 0, "activation": {"std": [1.0, 2.0]}, "gradient": {}},
                    XSS_FINDING_MODULE: {"type": "ReLU", "index": 1, "activation": {"std": [0.0, 0.0]}, "gradient": {}}},
        "types": {}, "definitions": {}}))
    (folder / "findings.json").write_text(json.dumps([{
        "kind": "dead_activation", "module": XSS_FINDING_MODULE, "step": 10, "severity": "error",
        "message": "<img src=x onerror=alert(2)> is dead", "action": "check <b>it</b>", "evidence": {}}]))
    (folder / "report.html").write_text("<html><body><script>alert('report')</script>report</body></html>")
    return {"source": {"kind": "script", "script": "train.py", "argv": ["--lr", "<i>1</i>"]},
            "summary": {"kind": "run", "modules": 2, "steps_seen": 11, "steps_sampled": 2, "every": 10,
                        "order_source": "observed", "findings": 1, "report_files": ["report.html"]}}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(repository folder, project folder, outside folder) with one capture and one stats run whose
    texts hold HTML, a secret file next to the repository, and a link inside it pointing there."""
    base = tmp_path_factory.mktemp("ui-site")
    root, project, outside = base / "repo", base / "project", base / "outside"
    project.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    repo = Repository(root)
    repo.create("captures", "evil", _write_capture)
    repo.create("stats", "evil", _write_stats)
    (root / "link-out.txt").symlink_to(outside / "secret.txt")
    (root / "captures" / "evil" / "v1" / "dir-link").symlink_to(outside, target_is_directory=True)
    (project / "loop.py").write_text(
        "import os, sys, time\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "while True:\n    time.sleep(0.05)\n")
    return root, project, outside


@pytest.fixture(scope="module")
def client(site):
    root, project, _ = site
    with TestClient(build_app(UiSettings(repo_root=root, project_root=project)), base_url=LOCAL) as c:
        yield c


def _post(client, url, body, **headers):
    return client.post(url, content=json.dumps(body),
                       headers={"X-ModuleLens-Action": "1", "Content-Type": "application/json", **headers})


# --------------------------------------------------------------------------------------------
# Pages and escaping
# --------------------------------------------------------------------------------------------


def test_root_lists_the_captures_by_name_with_user_text_escaped(client):
    r = client.get("/")
    assert r.status_code == 200
    assert ">evil</a>" in r.text
    assert "<img src=x" not in r.text and "&lt;img src=x onerror=alert(1)&gt;" in r.text
    assert "<b>Class</b>" not in r.text and "Evil&lt;b&gt;Class&lt;/b&gt;" in r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"


def test_capture_page_escapes_notes_and_draws_the_captured_module(client):
    r = client.get("/captures/evil")
    assert r.status_code == 200, r.text
    assert XSS_NOTE not in r.text and "&lt;script&gt;alert(&#34;note&#34;)&lt;/script&gt;" in r.text
    assert "data-captured" in r.text and "shape-only" in r.text
    assert '<span class="node-name">lin</span>' in r.text and '<span class="param">weight</span>' in r.text


def test_stats_page_escapes_findings_and_the_embedded_series(client):
    r = client.get("/stats/evil:v1")
    assert r.status_code == 200, r.text
    assert "<img src=x" not in r.text and "&lt;img src=x onerror=alert(2)&gt; is dead" in r.text
    assert XSS_FINDING_MODULE not in r.text  # neither in the HTML nor in the JSON block
    data = r.text.split('<script type="application/json" id="stats-data">')[1].split("</script>")[0]
    assert json.loads(data)["findings"][0]["module"] == XSS_FINDING_MODULE
    assert "&lt;i&gt;1&lt;/i&gt;" in r.text


def test_error_page_escapes_the_reference_it_could_not_find(client):
    r = client.get("/captures/%3Cscript%3Ealert(1)%3C!--")
    assert r.status_code == 404
    assert "<script>alert(1)" not in r.text and "&lt;script&gt;alert(1)" in r.text
    r = client.get("/candidates/nope:v1")
    assert r.status_code == 404 and "no candidate named" in r.text


def test_unknown_pages_and_json_errors(client):
    assert client.get("/no/such/page").status_code == 404
    r = client.get("/api/jobs/doesnotexist")
    assert r.status_code == 404 and r.json()["error"].startswith("no job")


# --------------------------------------------------------------------------------------------
# Files: only inside the repository
# --------------------------------------------------------------------------------------------


def test_a_repository_file_is_served_sandboxed(client):
    r = client.get("/repo/stats/evil/v1/report.html")
    assert r.status_code == 200 and "report" in r.text
    assert r.headers["content-security-policy"].startswith("sandbox")
    r = client.get("/repo/stats/evil/v1/series.json")
    assert r.status_code == 200 and r.json()["steps"] == [0, 10]


@pytest.mark.parametrize("path", [
    "/repo/../outside/secret.txt",
    "/repo/..%2Foutside%2Fsecret.txt",
    "/repo/%2e%2e/outside/secret.txt",
    "/repo/%2e%2e%2f%2e%2e%2foutside%2fsecret.txt",
    "/repo/captures/../../outside/secret.txt",
    "/repo/captures/%2e%2e/%2e%2e/outside/secret.txt",
    "/repo//etc/passwd",
    "/repo/%2Fetc%2Fpasswd",
    "/repo/link-out.txt",
    "/repo/captures/evil/v1/dir-link/secret.txt",
    "/repo/..%5Coutside%5Csecret.txt",
    "/repo/captures/evil/v1/manifest.json%00.png",
    "/repo/.tmp/anything",
    "/repo/captures",
    "/static/../../outside/secret.txt",
    "/static/%2e%2e/%2e%2e/%2e%2e/outside/secret.txt",
])
def test_path_traversal_is_refused(client, path):
    r = client.get(path)
    assert r.status_code in (400, 404), (path, r.status_code)
    assert SECRET not in r.text and "root:" not in r.text


def test_references_that_could_escape_are_refused(client):
    for path in ("/captures/..%2F..%2Foutside", "/captures/%2e%2e", "/captures/%2e%2e:v1", "/stats/%2e%2e", "/cards/a%2F..%2F..%2Fb"):
        r = client.get(path)
        assert r.status_code == 404, path
        assert SECRET not in r.text


# --------------------------------------------------------------------------------------------
# Binding, token, other sites
# --------------------------------------------------------------------------------------------


def test_binding_anything_but_loopback_needs_the_flag_and_then_a_token():
    assert bind_token("127.0.0.1", False, None) is None
    assert bind_token("::1", False, None) is None
    assert bind_token("localhost", False, "given") == "given"
    with pytest.raises(ModuleLensError, match="only loopback"):
        bind_token("0.0.0.0", False, None)
    token = bind_token("0.0.0.0", True, None)
    assert token and len(token) >= 24
    assert bind_token("192.168.1.7", True, "mine") == "mine"


def test_cli_refuses_a_remote_host_without_the_flag(cli):
    code, _, r = cli("ui", "--host", "0.0.0.0", "--port", "0")
    assert code == 2
    assert "only loopback" in r.output and "--allow-remote" in r.output


@pytest.mark.slow
def test_the_ui_command_serves_until_interrupted(site):
    root, project, _ = site
    proc = subprocess.Popen([sys.executable, "-m", "modulelens", "ui", "--port", "0", "--repo", str(root)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=project)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        url = None
        deadline = time.time() + 60
        while url is None and time.time() < deadline:
            line = lines.get(timeout=max(0.1, deadline - time.time()))
            if line.strip().startswith("open http://127.0.0.1:"):
                url = line.split()[-1]
        assert url is not None and "token" not in url
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200 and ">evil</a>" in r.read().decode()
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
    assert code == 0


def test_a_token_is_required_on_every_request(site):
    root, project, _ = site
    app = build_app(UiSettings(repo_root=root, project_root=project, token="s3cret-token"))
    with TestClient(app, base_url="http://10.1.2.3:8765") as c:
        for path in ("/", "/captures/evil", "/static/app.js", "/api/jobs", "/repo/stats/evil/v1/report.html"):
            r = c.get(path)
            assert r.status_code == 401, path
            assert "evil" not in r.text and "report" not in r.text
        assert c.get("/", headers={"X-ModuleLens-Token": "wrong"}).status_code == 403
        assert c.get("/", params={"token": "s3cret-token-but-longer"}).status_code == 403
        assert c.get("/", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        assert _post(c, "/api/jobs", {"action": "replay", "params": {"ref": "evil"}}).status_code == 401
        r = c.get("/", params={"token": "s3cret-token"})  # exchanged for a cookie, then redirected
        assert r.status_code == 200 and ">evil</a>" in r.text and "token" not in str(r.url)
        assert "modulelens_ui_token=s3cret-token" in r.history[0].headers["set-cookie"]
        assert "HttpOnly" in r.history[0].headers["set-cookie"]
        # the cookie now rides along: links need not repeat the token
        assert c.get("/captures/evil").status_code == 200
        assert c.get("/static/app.js").status_code == 200


def test_the_first_visit_exchanges_the_token_for_a_strict_httponly_cookie_and_drops_it_from_the_url(site):
    root, project, _ = site
    app = build_app(UiSettings(repo_root=root, project_root=project, token="s3cret-token"))
    with TestClient(app, base_url="http://10.1.2.3:8765", follow_redirects=False) as c:
        r = c.get("/captures/evil", params={"token": "s3cret-token", "tab": "x y"})
        assert r.status_code == 303 and r.text == ""
        assert r.headers["location"] == "/captures/evil?tab=x+y"  # the rest of the query kept
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("modulelens_ui_token=s3cret-token;")
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {part.strip() for part in cookie.split(";")}
        assert r.headers["referrer-policy"] == "no-referrer"
        c.cookies.clear()
        r = c.get(r.headers["location"], headers={"Cookie": "modulelens_ui_token=s3cret-token"})
        assert r.status_code == 200 and "evil" in r.text and "set-cookie" not in r.headers
        # always a path of this server, whatever the request's path looked like
        assert without_token({"raw_path": b"//attacker.example/x", "query_string": b"token=t&a=1"}) == (
            "/attacker.example/x?a=1")
        # a wrong token gets no cookie and no redirect; API calls keep their token and get no redirect
        r = c.get("/", params={"token": "wrong"})
        assert r.status_code == 403 and "set-cookie" not in r.headers
        r = c.get("/api/jobs", params={"token": "s3cret-token"})
        assert r.status_code == 200 and r.json() == {"jobs": []}


def test_without_a_token_only_requests_for_localhost_are_answered(site):
    root, project, _ = site
    app = build_app(UiSettings(repo_root=root, project_root=project))
    with TestClient(app, base_url="http://attacker.example") as c:
        r = c.get("/")
        assert r.status_code == 403 and "evil" not in r.text
    for base in ("http://localhost:1234", "http://[::1]:8765", "http://127.0.0.1"):
        with TestClient(app, base_url=base) as c:
            assert c.get("/").status_code == 200, base


def test_changes_need_the_action_header_and_the_same_origin(client):
    r = client.post("/api/jobs", content=json.dumps({"action": "replay", "params": {"ref": "evil"}}),
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 403 and "header" in r.text
    r = _post(client, "/api/jobs", {"action": "replay", "params": {"ref": "evil"}}, Origin="http://attacker.example")
    assert r.status_code == 403
    assert client.get("/api/jobs").json() == {"jobs": []}


# --------------------------------------------------------------------------------------------
# Actions and jobs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, status, words", [
    ({"action": "install_skills", "params": {"target": "/tmp/x"}}, 400, "no action"),
    ({"action": "replay", "params": {"ref": "evil", "device": "cuda"}}, 400, "takes no device"),
    ({"action": "gather_stats", "params": {"script": "../outside/secret.txt"}}, 404, "no script"),
    ({"action": "gather_stats", "params": {"script": "/etc/passwd"}}, 404, "no script"),
    ({"action": "gather_stats", "params": {"script": "loop.py", "every": 0}}, 400, "every"),
    ({"action": "validate"}, 400, "needs candidate"),
    ({"action": "gather_stats", "params": {}}, 400, "invalid gather_stats request"),
    ({"params": {}}, 400, "action name"),
])
def test_actions_are_limited_and_checked_before_anything_runs(client, body, status, words):
    r = _post(client, "/api/jobs", body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]
    assert all(j["action"] != "install_skills" for j in client.get("/api/jobs").json()["jobs"])


def _wait(client, job_id, states, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.get(f"/api/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {job['state']}: {job}")


@pytest.mark.slow
def test_a_failing_tool_run_shows_its_error(client):
    r = _post(client, "/api/jobs", {"action": "replay", "params": {"ref": "evil"}})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["state"] == "running" and job["tool"] == "replay_module" and job["subject"] == "evil"
    job = _wait(client, job["id"], {"done", "failed", "stopped"})
    assert job["state"] == "failed", job
    assert job["error"] and "evil" in job["error"]


@pytest.mark.slow
def test_a_long_run_can_be_stopped(client, site, tmp_path):
    pid_file = tmp_path / "pid"
    r = _post(client, "/api/jobs", {"action": "gather_stats",
                                   "params": {"script": "loop.py", "script_args": str(pid_file), "every": 1}})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["request"]["script"] == str(site[1] / "loop.py")
    deadline = time.time() + 120
    while not (pid_file.is_file() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.2)
    assert pid_file.is_file(), client.get(f"/api/jobs/{job['id']}").json()
    pid = int(pid_file.read_text())
    assert client.get(f"/api/jobs/{job['id']}").json()["state"] == "running"
    assert _post(client, f"/api/jobs/{job['id']}/stop", {}).status_code == 200
    job = _wait(client, job["id"], {"done", "failed", "stopped"}, timeout=30)
    assert job["state"] == "stopped"
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the script's process {pid} outlived the stopped job")


# --------------------------------------------------------------------------------------------
# Sections to come, and their extension point
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Searches
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A repository holding one hand-written search over two cards: a tree with a custom node on
    the best path (its report flagged), a rejected sibling whose reason holds HTML, and a child."""
    from modulelens.search.model import NodeRecord, SearchManifest, SearchSettings, SearchTarget, TargetOutcome
    from modulelens.search.store import save_search, search_key, write_node
    from modulelens.validation.stored_reports import REPORT_FILE, REPORTS

    root = tmp_path_factory.mktemp("searched")
    repo = Repository(root)

    def write_report(folder: Path) -> dict:
        (folder / REPORT_FILE).write_text(json.dumps({
            "verdict": "custom", "correct": True, "reason": "ok", "stage": "done", "backend": "cpp",
            "flags": ["suspicious: 40x faster than eager <b>really</b>"], "speedup_vs_eager": 1.8}))
        return {"candidate": "blk.card6:v1", "verdict": "custom", "correct": True,
                "settings": {"card_id": "blk:v1/6"}}

    report = repo.create(REPORTS, "blk.card6.v1", write_report).ref
    targets = [SearchTarget(index=0, card_id="blk:v1/6", op="aten._softmax.default", kind="memory"),
               SearchTarget(index=1, card_id="blk:v1/2", op="aten.gelu.default", kind="memory")]
    settings = SearchSettings(max_evals=3, patience=3)
    manifest = SearchManifest(search_id="opt-blk", key=search_key(targets, settings), settings=settings, targets=targets,
                              outcome=[TargetOutcome(target="blk:v1/6", op="aten._softmax.default",
                                                     best_candidate="blk.card6:v1", best_node=1, speedup_vs_eager=1.8,
                                                     evaluations=3, nodes=3, remeasured=True)],
                              stopped_because="max_evals")
    save_search(repo, manifest)
    nodes = [NodeRecord(node=0, status="root"),
             NodeRecord(node=1, parent=0, lineage=[0], status="evaluated", candidate_id="blk.card6:v1",
                        verdict="custom", correct=True, speedup_vs_eager=1.8, latency_s=2e-5, report=report,
                        provider="template", variant=0),
             NodeRecord(node=2, parent=0, lineage=[0], status="failed", verdict="rejected",
                        reason="<script>alert('node')</script> wrong values", provider="template", variant=1),
             NodeRecord(node=3, parent=1, lineage=[0, 1], status="evaluated", verdict="custom", correct=True,
                        speedup_vs_eager=1.2, candidate_id="blk.card6:v2", provider="template", variant=2)]
    for n in nodes:
        write_node(repo, "opt-blk", 0, n)
    write_node(repo, "opt-blk", 1, NodeRecord(node=0, status="root"))
    return root


@pytest.fixture
def search_client(searched, site):
    with TestClient(build_app(UiSettings(repo_root=searched, project_root=site[1])), base_url=LOCAL) as c:
        yield c


def test_the_searches_page_lists_each_search_with_its_best_per_target(search_client):
    r = search_client.get("/searches")
    assert r.status_code == 200 and "None yet." not in r.text
    assert 'href="/searches/opt-blk"' in r.text and "blk.card6:v1" in r.text and "1.8×" in r.text
    assert "max_evals" in r.text and "not finished" in r.text  # the second target has no outcome yet


def test_a_search_page_shows_the_tree_with_verdicts_speedups_flags_and_the_best_path(search_client):
    r = search_client.get("/searches/opt-blk")
    assert r.status_code == 200, r.text
    text = r.text
    for piece in ('data-node="1"', 'data-node="2"', 'data-node="3"', "verdict-custom", "verdict-rejected", "1.8×",
                  "1.2×", "20.0 µs", 'data-action="continue_search"', 'data-job-for="continue_search"',
                  'data-refresh-for="continue_search"', "No outcome yet"):
        assert piece in text, piece
    node1 = text.split('data-node="1"')[1].split('data-node="2"')[0]
    assert 'data-node="3"' in node1  # node 3 is drawn under node 1
    assert "on-best-path" in text.split('data-node="1"')[0].rsplit("<li", 1)[1]
    assert "flag: suspicious: 40x faster than eager &lt;b&gt;really&lt;/b&gt;" in text  # from node 1's report
    assert "&lt;script&gt;alert(&#39;node&#39;)&lt;/script&gt;" in text and "<script>alert('node')" not in text
    assert search_client.get("/searches/nope").status_code == 404


def test_continue_runs_optimize_on_the_stored_search_and_is_checked_first(search_client):
    r = _post(search_client, "/api/jobs", {"action": "continue_search", "params": {"search_id": "nope"}})
    assert r.status_code == 404 and "no search named" in r.json()["error"]
    r = _post(search_client, "/api/jobs", {"action": "continue_search", "params": {"search_id": "opt-blk", "more": 0}})
    assert r.status_code == 400 and "between 1 and 1000" in r.json()["error"]
    r = _post(search_client, "/api/jobs", {"action": "continue_search", "params": {"search_id": "opt-blk", "more": 2}})
    assert r.status_code == 202, r.text
    job = r.json()
    assert (job["tool"], job["subject"], job["label"]) == ("optimize", "opt-blk", "continue search opt-blk")
    request = job["request"]
    assert request["targets"] == ["blk:v1/6", "blk:v1/2"] and request["search_id"] == "opt-blk"
    assert (request["provider"], request["backend"], request["patience"]) == ("template", "cpp", 3)
    assert request["max_evals"] == 3 + 2  # the nodes it has, and two more
    assert _post(search_client, f"/api/jobs/{job['id']}/stop", {}).status_code == 200
    assert _wait(search_client, job["id"], {"done", "failed", "stopped"}, timeout=60)["state"] in ("stopped", "failed")


def test_speedups_read_as_intervals_when_the_report_has_one():
    from modulelens.ui.render import speedup

    assert speedup({"speedup_vs_eager": 1.42, "speedup_interval": [1.31, 1.55], "timing_status": "ok"}) == (
        "1.42× [1.31, 1.55]")
    assert speedup({"speedup_vs_eager": 1.4, "timing_status": "undetermined", "timing_reason": "noisy machine"}) == (
        "undetermined (noisy machine)")
    assert speedup({"speedup_vs_eager": 2.0}) == "2×" and speedup({"speedup_vs_eager": None}) == "–"


def test_searches_and_packs_say_none_yet(client):
    for path in ("/searches", "/packs"):
        r = client.get(path)
        assert r.status_code == 200 and "None yet." in r.text


def _fake_list_tool(monkeypatch, packs):
    """Replace the registry's ``list`` tool by one listing ``packs()`` (which may raise) and cutting
    them to its ``limit`` (2 by default, at most 100) like the real one."""
    from typing import Any, Literal

    from pydantic import BaseModel, Field

    from modulelens.listing import LeftOut, keep_first
    from modulelens.registry import Tool
    from modulelens.replies import ToolReply
    from modulelens.ui import state

    class ListRequest(BaseModel):
        kind: Literal["packs", "searches"]
        limit: int = Field(2, ge=1, le=100)

    class ListPacksResult(ToolReply):
        packs: list[Any]
        left_out: list[LeftOut] = Field(default_factory=list)

    def list_packs(req: ListRequest, ctx) -> ListPacksResult:
        return keep_first(ListPacksResult(packs=packs()), "packs", req.limit, "packs/")

    fake = Tool(name="list", request=ListRequest, result=ListPacksResult, summary="", fn=list_packs)
    real = state.get_tool
    monkeypatch.setattr(state, "get_tool", lambda name: fake if name == "list" else real(name))


def test_the_packs_page_shows_what_the_list_tool_gives_escaped(client, monkeypatch):
    from modulelens.dispatch.results import PackUse
    from modulelens.team.packs import PackListEntry

    use = PackUse(subject="<i>train.py</i>", ok=True, hits=12, summary="12 hits (4 backward, 8 forward), 0 fallbacks")
    entry = PackListEntry(ref="<b>softmax</b>:v1", path="/nowhere", sha256="0" * 64, trusted=False, entries=2,
                          dispatched=1, shape_rules=1, backward=1, created_at="today", last_run=use)
    _fake_list_tool(monkeypatch, lambda: [entry])
    r = client.get("/packs")
    assert r.status_code == 200 and "None yet." not in r.text
    assert "&lt;b&gt;softmax&lt;/b&gt;:v1" in r.text and "<i>train.py</i>" not in r.text
    assert "12 hits (4 backward, 8 forward)" in r.text and "untrusted" in r.text


def test_pages_show_whole_lists_whatever_a_tool_lists_by_default(client, monkeypatch):
    from modulelens.team.packs import PackListEntry

    _fake_list_tool(monkeypatch, lambda: [PackListEntry(ref=f"pack-{i}:v1", path="/nowhere", sha256="0" * 64,
                                                        trusted=True, entries=1, dispatched=1, created_at="today")
                                          for i in range(5)])
    r = client.get("/packs")
    assert r.status_code == 200 and all(f"pack-{i}" in r.text for i in range(5))


def test_error_text_names_form_fields_not_cli_flags(client, monkeypatch):
    def failing():
        raise ModuleLensError("the script ran past [--timeout] (900 s)", "raise [--timeout], or use [--strategy export]")

    _fake_list_tool(monkeypatch, failing)
    r = client.get("/searches")
    assert r.status_code == 400 and "[--" not in r.text
    assert "ran past timeout (900 s)" in r.text and "raise timeout, or use strategy=export" in r.text
    r = _post(client, "/api/jobs", {"action": "gather_stats", "params": {"script": "loop.py", "capture": "evil"}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error.startswith("invalid gather_stats request: ") and "[--" not in error and "capture" in error


def test_a_validation_job_asks_for_the_longest_lists(client):
    r = _post(client, "/api/jobs", {"action": "validate", "params": {"candidate": "nothing.card0:v1"}})
    assert r.status_code == 202, r.text
    assert r.json()["request"]["limit"] == 100  # the most the schema allows
    _wait(client, r.json()["id"], {"done", "failed", "stopped"})


# --------------------------------------------------------------------------------------------
# Pure logic
# --------------------------------------------------------------------------------------------


def test_module_tree_marks_the_path_and_the_captured_module():
    tree = module_tree("blocks.1", "model:Block", [ParamLeaf("attn.qkv.weight", [192, 64], "float32"),
                                                  ParamLeaf("ln1.bias", [64], "float32")])
    assert (tree.name, tree.role) == ("model", "ancestor")
    blocks = tree.children[0]
    one = blocks.children[0]
    assert (blocks.path, blocks.role, one.path, one.role, one.class_name) == ("blocks", "ancestor", "blocks.1",
                                                                            "captured", "Block")
    assert [c.path for c in one.children] == ["blocks.1.attn", "blocks.1.ln1"]
    assert one.children[0].children[0].params[0].name == "weight"
    root = module_tree("", "kb:Model", [])
    assert root.role == "captured" and root.class_name == "Model"


def test_highlight_escapes_every_piece_of_source():
    html = str(highlight('// a <b>\n#include <x.h>\nint f() { return "<script>" ; } // 1.5f', "cpp"))
    assert "<script>" not in html and "<b>" not in html
    assert '<span class="tok-kw">return</span>' in html and '<span class="tok-type">int</span>' in html
    assert '<span class="tok-pre">#include &lt;x.h&gt;</span>' in html
    py = str(highlight("@triton.jit\ndef k(x):  # <i>\n    return '<a>' + 1\n", "python"))
    assert "<i>" not in py and "<a>" not in py and '<span class="tok-kw">def</span>' in py
