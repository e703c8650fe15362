"""The UI's Starlette application: routes, the security guard, error pages, static files."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from modulelens.errors import InvalidName, ModuleLensError, ReferenceNotFound
from modulelens.ui import api, pages
from modulelens.ui.jobs import UI_FRONT, UiJobs
from modulelens.ui.render import STATIC, make_environment
from modulelens.ui.sections import list_backed
from modulelens.ui.security import Guard
from modulelens.ui.state import UiSettings, UiState, ui_state


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _error(request: Request, status: int, message: str, hint: str | None) -> Response:
    if _wants_json(request):
        return JSONResponse({"error": message, "hint": hint}, status_code=status)
    return ui_state(request).page("error.html", "", status=status, title="Error", status_code=status,
                                  message=message, hint=hint)


async def _modulelens_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ModuleLensError)
    status = 404 if isinstance(exc, (ReferenceNotFound, InvalidName)) else 400
    return _error(request, status, *exc.rendered(UI_FRONT))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = "no such page" if exc.status_code == 404 else str(exc.detail)
    return _error(request, exc.status_code, message, "the sections are in the bar at the top")


def build_app(settings: UiSettings) -> Starlette:
    """The web app for one repository. Jobs it started are stopped when the app shuts down."""
    state = UiState(settings=settings, jobs=UiJobs(settings.repo_root, settings.project_root),
                    env=make_environment())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            state.jobs.close()

    routes = [
        Route("/", pages.captures_page),
        Route("/captures/{ref}", pages.capture_page),
        Route("/cards", pages.opsets_page),
        Route("/cards/{ref}", pages.opset_page),
        Route("/candidates", pages.candidates_page),
        Route("/candidates/{ref}", pages.candidate_page),
        Route("/stats", pages.stats_runs_page),
        Route("/stats/{ref}", pages.stats_run_page),
        Route("/searches", pages.searches_page),
        Route("/searches/{ref}", pages.search_page),
        Route("/packs", pages.packs_page),
        *(Route(s.href, pages.list_section_page) for s in list_backed()),
        Route("/jobs", pages.jobs_page),
        Route("/api/jobs", api.list_jobs, methods=["GET"]),
        Route("/api/jobs", api.start_job, methods=["POST"]),
        Route("/api/jobs/{job_id}", api.show_job, methods=["GET"]),
        Route("/api/jobs/{job_id}/stop", api.stop_job, methods=["POST"]),
        Route("/repo/{path:path}", api.repo_file),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, token=settings.token)],
        exception_handlers={ModuleLensError: _modulelens_error, HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.ui = state
    return app
