"""What every request handler of the UI shares: the settings, the jobs, the templates, and
the one way to get data: calling a tool from the registry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import HTMLResponse

from modulelens.listing import everything
from modulelens.registry import ToolContext
from modulelens.tools import get_tool
from modulelens.ui.jobs import UiJobs


class UiSettings(BaseModel):
    repo_root: Path = Field(description="The artifact repository the UI shows.")
    project_root: Path = Field(description="Where scripts started from the UI may live (the server's folder).")
    token: str | None = Field(None, description="Required on every request when set (non-loopback binds).")


@dataclass
class UiState:
    settings: UiSettings
    jobs: UiJobs
    env: Environment

    def call(self, tool_name: str, **fields: Any) -> Any:
        """The result of the registered tool ``tool_name`` for a request built from ``fields``, with
        nothing cut (``top``, ``limit`` and detail levels lifted, unless ``fields`` sets them): the
        pages show whole results."""
        tool = get_tool(tool_name)
        request = tool.request.model_validate({**everything(tool.request), **fields})
        return tool(request, ToolContext(repo_root=self.settings.repo_root))

    def page(self, template: str, active: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A rendered page; ``active`` names the section highlighted in the navigation."""
        html = self.env.get_template(template).render(active=active, repo=str(self.settings.repo_root), **context)
        return HTMLResponse(html, status_code=status)


def ui_state(request: Request) -> UiState:
    return request.app.state.ui
