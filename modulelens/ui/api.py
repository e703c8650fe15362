"""The UI's JSON endpoints (jobs) and the repository file route.

- ``GET /api/jobs``: the repository's jobs (started here or over MCP), newest first (the pages poll it).
- ``POST /api/jobs`` with ``{"action": "replay", "params": {"ref": "blk:v1"}}``: start a job
  (actions in :data:`modulelens.ui.jobs.ACTIONS`); answers 202 with the job.
- ``GET /api/jobs/{id}``, ``POST /api/jobs/{id}/stop``.
- ``GET /repo/{path}``: a file inside the repository (reports, plots, kernel sources), served as
  text unless it is HTML, an image or JSON; never anything outside (see
  :func:`~modulelens.ui.security.resolve_inside`).
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse

from modulelens.errors import ModuleLensError
from modulelens.ui.security import resolve_inside
from modulelens.ui.state import ui_state

# Everything else is served as plain text (a kernel source, a log), never as something a browser runs.
_SHOWN_AS_IS = {".html": "text/html; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml",
                ".json": "application/json"}


def list_jobs(request: Request) -> JSONResponse:
    jobs = ui_state(request).jobs.jobs()
    return JSONResponse({"jobs": [j.model_dump(mode="json") for j in jobs]})


async def start_job(request: Request) -> JSONResponse:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise ModuleLensError("the request body is not JSON", 'send {"action": ..., "params": {...}}') from None
    if not isinstance(body, dict) or not isinstance(body.get("action"), str) \
            or not isinstance(body.get("params", {}), dict):
        raise ModuleLensError("a job needs an action name and a params object",
                              'send {"action": "replay", "params": {"ref": "blk:v1"}}')
    job = ui_state(request).jobs.start(body["action"], body.get("params", {}))
    return JSONResponse(job.model_dump(mode="json"), status_code=202)


def show_job(request: Request) -> JSONResponse:
    return JSONResponse(ui_state(request).jobs.get(request.path_params["job_id"]).model_dump(mode="json"))


def stop_job(request: Request) -> JSONResponse:
    return JSONResponse(ui_state(request).jobs.stop(request.path_params["job_id"]).model_dump(mode="json"))


def repo_file(request: Request) -> FileResponse:
    path = resolve_inside(ui_state(request).settings.repo_root, request.path_params["path"])
    return FileResponse(path, media_type=_SHOWN_AS_IS.get(path.suffix.lower(), "text/plain; charset=utf-8"))
