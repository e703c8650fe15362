"""Serving the UI (``modulelens ui``) with uvicorn, until interrupted.

The socket is bound here (so ``port=0`` picks a free port and the printed URL is right) and
handed to uvicorn. :class:`UiServer` also runs in a background thread, for tests and benchmarks.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn

from modulelens.errors import ModuleLensError
from modulelens.ui.app import build_app
from modulelens.ui.security import bind_token
from modulelens.ui.state import UiSettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


class UiServer:
    """The UI for one repository on ``host:port``: :meth:`serve_forever` (until Ctrl+C) or, as
    a context manager, in a background thread."""

    def __init__(self, repo_root: Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 allow_remote: bool = False, token: str | None = None, project_root: Path | None = None):
        self.token = bind_token(host, allow_remote, token)
        self.settings = UiSettings(repo_root=Path(repo_root).expanduser().resolve(),
                                   project_root=(project_root or Path.cwd()).resolve(), token=self.token)
        self.host = host
        try:
            self.socket = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError as exc:
            raise ModuleLensError(f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                                  "pick another port with --port (0 picks a free one)") from None
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(build_app(self.settings), log_level="warning", access_log=False, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The address to open, with the token when one is required."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def serve_forever(self) -> None:
        """Serve until interrupted (Ctrl+C or SIGTERM); running jobs it started are stopped on the way out."""
        self._server.run(sockets=[self.socket])

    def __enter__(self) -> UiServer:
        self._thread = threading.Thread(target=self.serve_forever, name="modulelens-ui", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the UI server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.socket.close()


def serve(repo_root: Path, host: str | None = None, port: int | None = None, allow_remote: bool = False,
          token: str | None = None) -> None:
    """``modulelens ui``: print the URL on stderr, then serve until interrupted (``host`` and
    ``port`` default to 127.0.0.1:8765)."""
    server = UiServer(repo_root, host or DEFAULT_HOST, DEFAULT_PORT if port is None else port, allow_remote, token)
    print(f"modulelens ui: repository {server.settings.repo_root}\n  open {server.url}\n  (Ctrl+C to stop)",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl+C it handled, once it has shut down
        pass
    print("modulelens ui: stopped", file=sys.stderr, flush=True)
