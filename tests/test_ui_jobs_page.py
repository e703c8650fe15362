"""The Jobs page's data (``/api/jobs``, through Starlette's TestClient) for jobs the UI did not
start: an agent's ``start_job`` or the CLI record a job by its tool and arguments only. Each shows
its subject (the tool and its main argument), a progress fraction only where the tool reported a
total (else an honest "running, N s"), and once done what it came to with a link to its page."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from modulelens.jobs import JobTable
from modulelens.jobs.table import now_iso, write_record
from modulelens.ui.app import build_app
from modulelens.ui.state import UiSettings


def _done(table: JobTable, tool: str, arguments: dict, result: dict) -> str:
    """A finished job as a job process leaves it (started the way start_job starts one)."""
    path = table.attach(tool, arguments)
    record = table.get(path.stem)
    write_record(path, record.model_copy(update={"state": "done", "ended_at": now_iso(), "owner": "",
                                                 "progress": 3.0, "total": 3.0, "result": result}))
    return record.job


def test_jobs_started_elsewhere_show_subject_progress_outcome_and_link(tmp_path: Path):
    repo = tmp_path / ".modulelens"
    table = JobTable(repo)
    running = table.attach("profile", {"target": "scale", "min_run_time": 0.5})  # running, nothing reported yet
    validated = _done(table, "validate_kernel", {"target": "blk/3", "source": "k.cpp", "backend": "cpp"},
                      {"verdict": "custom", "reason": "correct on captured and fresh inputs; faster than eager",
                       "speedup_vs_eager": 1.8, "candidate_id": "blk.card3:v2", "checks": []})
    profiled = _done(table, "profile", {"target": "scale"},
                     {"target": "scale:v1", "target_kind": "capture", "median_s": 1.2e-5, "p20_s": 1.1e-5, "p80_s": 1.4e-5})
    with TestClient(build_app(UiSettings(repo_root=repo, project_root=tmp_path)), base_url="http://127.0.0.1:8765") as c:
        jobs = {j["id"]: j for j in c.get("/api/jobs").json()["jobs"]}
        assert c.get("/jobs").status_code == 200

        job = jobs[running.stem]
        assert (job["label"], job["subject"], job["state"]) == ("profile scale", "scale", "running")
        assert job["progress"] is None and job["progress_text"].startswith("running, ") and job["progress_text"].endswith(" s")
        assert job["outcome"] is None and job["link"] is None

        job = jobs[validated]
        assert (job["label"], job["subject"], job["state"]) == ("validate_kernel blk/3", "blk/3", "done")
        assert job["outcome"] == ("custom: correct on captured and fresh inputs; faster than eager · speedup vs eager 1.80×")
        assert job["good"] is True and job["link"] == "/candidates/blk.card3%3Av2"
        assert c.get(job["link"]).status_code == 404  # a real page route (this candidate is not stored here)

        job = jobs[profiled]
        assert job["outcome"] == "scale:v1: median 12.0 µs (p20 11.0 µs, p80 14.0 µs)" and job["link"] == "/captures/scale%3Av1"

        record = table.get(running.stem)  # the tool reports a total: a real fraction
        write_record(running, record.model_copy(update={"progress": 1.0, "total": 4.0, "message": "timing scale"}))
        job = next(j for j in c.get("/api/jobs").json()["jobs"] if j["id"] == running.stem)
        assert job["progress"] == 0.25 and job["progress_text"].startswith("25%, ") and job["message"] == "timing scale"
