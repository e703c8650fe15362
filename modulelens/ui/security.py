"""What keeps the web UI safe to leave running.

- **Bind**: loopback (127.0.0.1, ::1, localhost) by default. Any other address needs an explicit
  ``allow_remote`` and then a token (given, or generated here) — :func:`bind_token`.
- **Token**: when the server has one, *every* request must carry it: header ``X-ModuleLens-Token``
  or ``Authorization: Bearer``, the cookie, or ``?token=`` (what the printed URL holds). The first
  visit exchanges it: a GET with a valid ``?token=`` (but for ``/api/``) is answered with a redirect
  to the same URL without the token, setting the token as an ``HttpOnly; SameSite=Strict`` cookie,
  so the token leaves the address bar, the history and any link copied from the page.
- **Other sites**: without a token, the ``Host`` header must name a loopback host (a page on
  another site cannot reach the server through DNS rebinding). Requests that change anything
  (anything but GET/HEAD) must carry the ``X-ModuleLens-Action`` header, which a cross-site form or
  script cannot add without a CORS preflight this server never grants, and an ``Origin``, when
  present, must be the server's own.
- **Files**: only regular files inside the repository, by a relative path without hidden parts
  (``..``, ``.tmp``), after symlinks are resolved — :func:`resolve_inside`.
- **Pages**: served with a Content-Security-Policy that allows only this server's own scripts and
  styles; every user text is escaped by the templates (autoescape).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from http.cookies import SimpleCookie
from pathlib import Path, PurePosixPath
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modulelens.errors import ModuleLensError, ReferenceNotFound

TOKEN_HEADER = "x-modulelens-token"
TOKEN_COOKIE = "modulelens_ui_token"
TOKEN_QUERY = "token"
ACTION_HEADER = "x-modulelens-action"
SAFE_METHODS = {"GET", "HEAD"}

PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
# Files from the repository (reports written by modulelens, or pulled from elsewhere): shown, never
# run: a sandboxed origin without scripts, inline styles and embedded images only.
FILE_POLICY = "sandbox; default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'"


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1), with or without brackets."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_token(host: str, allow_remote: bool, token: str | None) -> str | None:
    """The token the server will require: ``token`` as given on a loopback bind (None: none
    needed); on any other bind, only with ``allow_remote``, and then ``token`` or a fresh one."""
    if is_loopback(host):
        return token or None
    if not allow_remote:
        raise ModuleLensError(
            f"refusing to serve the UI on {host!r}: only loopback addresses are served by default",
            "pass --allow-remote to serve other hosts (every request then needs the token the server prints)",
        )
    return token or secrets.token_urlsafe(24)


def _host_name(host_header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8765`` -> ``::1``)."""
    return urlsplit(f"//{host_header}").hostname or ""


class Guard:
    """ASGI middleware enforcing the rules in the module docstring, and adding the security
    headers to every response."""

    def __init__(self, app: ASGIApp, token: str | None = None):
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope.get("method", "GET")
        refusal, set_cookie = self._check(scope, headers, method)
        if refusal is not None:
            status, text = refusal
            await _plain(send, status, text)
            return
        path = scope.get("path", "")
        if set_cookie and method in SAFE_METHODS and not path.startswith("/api/"):
            await _redirect(send, without_token(scope), self._cookie())
            return
        policy = FILE_POLICY if path.startswith("/repo/") else PAGE_POLICY

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [
                    (b"content-security-policy", policy.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                    # pages hold repository data: never stored; the vendored files: revalidated
                    (b"cache-control", b"no-cache" if path.startswith("/static/") else b"no-store"),
                ]
                if set_cookie:
                    extra.append((b"set-cookie", self._cookie()))
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _cookie(self) -> bytes:
        return f"{TOKEN_COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/".encode()

    def _check(self, scope: Scope, headers: dict[str, str], method: str) -> tuple[tuple[int, str] | None, bool]:
        """(refusal as (status, text) or None, whether to set the token cookie)."""
        set_cookie = False
        host = headers.get("host", "")
        if self.token is not None:
            supplied, from_query = self._supplied_token(scope, headers)
            if supplied is None:
                return (401, "this modulelens UI needs its token: open the URL the server printed "
                             "(it ends in ?token=...)"), False
            if not hmac.compare_digest(supplied.encode(), self.token.encode()):
                return (403, "wrong token for this modulelens UI"), False
            set_cookie = from_query
        elif not is_loopback(_host_name(host)):
            return (403, "this modulelens UI only answers requests addressed to localhost"), False
        if method not in SAFE_METHODS:
            if ACTION_HEADER not in headers:
                return (403, f"requests that change anything need the {ACTION_HEADER} header"), False
            origin = headers.get("origin")
            if origin is not None and urlsplit(origin).netloc != host:
                return (403, "request from another site refused"), False
        return None, set_cookie

    @staticmethod
    def _supplied_token(scope: Scope, headers: dict[str, str]) -> tuple[str | None, bool]:
        if TOKEN_HEADER in headers:
            return headers[TOKEN_HEADER], False
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip(), False
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if query.get(TOKEN_QUERY):
            return query[TOKEN_QUERY][0], True
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("cookie", ""))
        except Exception:  # noqa: BLE001  (a malformed cookie header is simply no token)
            return None, False
        if TOKEN_COOKIE in cookie:
            return cookie[TOKEN_COOKIE].value, False
        return None, False


def without_token(scope: Scope) -> str:
    """The request's path and query (as sent) without its ``token`` parameter: where the first
    visit is redirected. Always a path on this server (a leading ``//`` is collapsed)."""
    raw = scope.get("raw_path") or scope.get("path", "/").encode()
    path = "/" + raw.decode("latin-1").lstrip("/")
    query = [(k, v) for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
             if k != TOKEN_QUERY]
    return path + ("?" + urlencode(query) if query else "")


async def _redirect(send: Send, location: str, cookie: bytes) -> None:
    await send({"type": "http.response.start", "status": 303, "headers": [
        (b"location", location.encode("latin-1")), (b"set-cookie", cookie), (b"content-length", b"0"),
        (b"cache-control", b"no-store"), (b"referrer-policy", b"no-referrer"), (b"x-content-type-options", b"nosniff")]})
    await send({"type": "http.response.body", "body": b""})


async def _plain(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
        (b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


def resolve_inside(root: Path, rel: str) -> Path:
    """The regular file ``rel`` (a relative POSIX path) names inside ``root``, symlinks resolved.

    Raises :class:`~modulelens.errors.ReferenceNotFound` for anything else: an absolute path, a
    hidden or ``..`` part, a backslash or NUL, a link leading outside, a folder, a missing file.
    """
    def refuse() -> ReferenceNotFound:
        return ReferenceNotFound(f"no file {rel!r} in the repository", "files are addressed relative to the "
                                 "repository folder, e.g. stats/train/v1/report.html")

    if not rel or "\\" in rel or "\x00" in rel:
        raise refuse()
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or any(p.startswith(".") for p in parts):
        raise refuse()
    base = root.resolve()
    try:
        path = (base / rel).resolve()
    except (OSError, RuntimeError):
        raise refuse() from None
    if not path.is_relative_to(base) or not path.is_file():
        raise refuse()
    return path
