"""The ``anthropic`` provider: a kernel (or a module's ``ModelNew``) written by Claude through the
Anthropic Messages API.

Plain HTTPS with :mod:`urllib.request` (no SDK), behind a small :class:`Transport` so tests can
fake the wire. Settings, read when ``generate`` runs:

* ``ANTHROPIC_API_KEY`` (required; checked before any request).
* ``ANTHROPIC_BASE_URL`` (default ``https://api.anthropic.com``).
* ``MODULELENS_ANTHROPIC_MODEL`` (default :data:`DEFAULT_MODEL`).
* ``MODULELENS_ANTHROPIC_MAX_TOKENS`` (default 16000), ``MODULELENS_ANTHROPIC_MAX_ATTEMPTS``
  (default 4), ``MODULELENS_ANTHROPIC_TIMEOUT`` (seconds per request, default 600).
* ``MODULELENS_PRICE_IN`` / ``MODULELENS_PRICE_OUT``: USD per million input/output tokens, to
  override :data:`PRICES` (the cost in provenance is an estimate from list prices).

Rate limits (429) and overload/server errors (5xx, 529) are retried, honouring ``retry-after``,
else with exponential backoff and jitter; other 4xx errors stop at once with the API's message.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, Protocol

from modulelens.errors import ModuleLensError
from modulelens.kernels.module_candidates import ModuleCandidate
from modulelens.kernels.source import KernelSource
from modulelens.providers.module_prompting import MODULE_LANGUAGE, build_module_messages
from modulelens.providers.module_request import ModuleRequest, module_lineage
from modulelens.providers.prompting import build_messages, extract_code, prompt_sha256
from modulelens.providers.request import GenerationRequest, lineage

DEFAULT_MODEL = "claude-sonnet-4-5"
DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 16000
DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_TEMPERATURE = 0.7
MAX_RETRY_AFTER_S = 120.0

# List prices, USD per million tokens (input, output), matched by model id prefix (longest first).
# An estimate: it ignores prompt caching and batch discounts; override with MODULELENS_PRICE_IN/OUT.
PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
}

NO_KEY_HINT = (
    "export ANTHROPIC_API_KEY=... (a key from console.anthropic.com) in the environment modulelens runs in, "
    "or use [--provider template] (offline) or [--provider sampling] (the MCP client's own model)"
)


class Transport(Protocol):
    def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float) -> tuple[int, dict[str, str], bytes]:
        """POST ``body``; returns (status, response headers, response body), also for HTTP errors.
        Raises OSError when no response arrives (connection refused, timeout, DNS)."""
        ...


class UrllibTransport:
    def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - https URL from settings
                return resp.status, dict(resp.headers.items()), resp.read()
        except urllib.error.HTTPError as e:
            try:
                data = e.read()
            except OSError:
                data = b""
            return e.code, dict(e.headers.items()) if e.headers else {}, data


def price_per_mtok(model: str) -> tuple[float, float, str] | None:
    """(input, output, source) USD per million tokens for ``model``, or None when unknown."""
    env_in, env_out = os.environ.get("MODULELENS_PRICE_IN"), os.environ.get("MODULELENS_PRICE_OUT")
    if env_in and env_out:
        try:
            return float(env_in), float(env_out), "env"
        except ValueError:
            raise ModuleLensError(
                f"MODULELENS_PRICE_IN/OUT must be numbers (USD per million tokens), got {env_in!r}/{env_out!r}")
    for prefix in sorted(PRICES, key=len, reverse=True):
        if model.startswith(prefix):
            p_in, p_out = PRICES[prefix]
            return p_in, p_out, "table"
    return None


def _env_number(name: str, default: float, cast: Callable[[str], Any] = float) -> Any:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return cast(raw)
    except ValueError:
        raise ModuleLensError(f"{name}={raw!r} is not a number", f"unset it or give a number (default {default})")


def _header(headers: dict[str, str], name: str) -> str | None:
    for k, v in headers.items():
        if k.lower() == name:
            return v
    return None


def _api_message(body: bytes) -> str:
    try:
        data = json.loads(body)
        err = data.get("error") or {}
        msg = err.get("message") or data.get("message")
        kind = err.get("type")
        if msg:
            return f"{kind}: {msg}" if kind else str(msg)
    except (ValueError, AttributeError):
        pass
    text = body.decode("utf-8", "replace").strip()
    return text[:500] or "(empty response body)"


_STATUS_HINTS = {
    401: "check that ANTHROPIC_API_KEY holds a valid key",
    403: "the key is not allowed to do this; check its workspace and permissions",
    404: "check MODULELENS_ANTHROPIC_MODEL (a model id your key can use) and ANTHROPIC_BASE_URL",
    413: "the prompt is too large; validate with fewer errors in the parent report",
}


class AnthropicProvider:
    name = "anthropic"

    def __init__(
        self,
        transport: Transport | None = None,
        *,
        api_key: str | None = None,
        model: str | None = None,
        base_url: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = DEFAULT_TEMPERATURE,
        max_attempts: int | None = None,
        timeout: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ):
        self.transport = transport or UrllibTransport()
        self._api_key, self._model, self._base_url = api_key, model, base_url
        self._max_tokens, self._max_attempts, self._timeout = max_tokens, max_attempts, timeout
        self.temperature = temperature
        self.sleep = sleep
        self.rng = rng or random.Random()

    # Settings are read per call so that environment changes (and tests) take effect.
    @property
    def model(self) -> str:
        return self._model or os.environ.get("MODULELENS_ANTHROPIC_MODEL") or DEFAULT_MODEL

    @property
    def base_url(self) -> str:
        return (self._base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")

    def _key(self) -> str:
        key = self._api_key or os.environ.get("ANTHROPIC_API_KEY", "").strip()
        if not key:
            raise ModuleLensError("ANTHROPIC_API_KEY is not set", NO_KEY_HINT)
        return key

    def generate(self, req: GenerationRequest, ctx: Any = None) -> KernelSource:
        system, user = build_messages(req)
        code, provenance = self._write(system, user, req.backend)
        provenance.update(variant=req.variant, **lineage(req))
        return KernelSource(backend=req.backend, source=code, provider=self.name,
                            params={"variant": req.variant}, provenance=provenance)

    def generate_module(self, req: ModuleRequest, ctx: Any = None) -> ModuleCandidate:
        """A ``ModelNew`` for the captured module ``req`` describes (a repair or an improvement of
        ``req.parent`` when given)."""
        system, user = build_module_messages(req)
        code, provenance = self._write(system, user, MODULE_LANGUAGE)
        provenance.update(variant=req.variant, **module_lineage(req))
        return ModuleCandidate(source=code, claims_training=req.training, provider=self.name, provenance=provenance)

    def _write(self, system: str, user: str, language: str) -> tuple[str, dict[str, Any]]:
        """(the code of the reply to the prompt, its provenance)."""
        key = self._key()  # before anything else: no key, no request
        reply = self.complete(system, user, key=key)
        try:
            code = extract_code(reply["text"], language)
        except ModuleLensError as e:
            if reply.get("stop_reason") == "max_tokens":
                raise ModuleLensError(e.message, "the reply was cut off at max_tokens; raise "
                                      "MODULELENS_ANTHROPIC_MAX_TOKENS or ask for a shorter kernel")
            raise
        return code, {
            "provider": self.name,
            "model": reply["model"],
            "requested_model": reply["requested_model"],
            "prompt_sha256": prompt_sha256(system, user),
            "input_tokens": reply["input_tokens"],
            "output_tokens": reply["output_tokens"],
            "cost_usd": reply["cost_usd"],
            "cost_is_estimate": True,
            "price_per_mtok": reply["price_per_mtok"],
            "attempts": reply["attempts"],
            "stop_reason": reply["stop_reason"],
            "request_id": reply["request_id"],
            "message_id": reply["message_id"],
            "temperature": self.temperature,
        }

    def complete(self, system: str, user: str, *, key: str | None = None) -> dict[str, Any]:
        """One Messages API call with retries. Returns text, model, tokens, cost, attempts, ids."""
        key = key or self._key()
        model = self.model
        max_tokens = self._max_tokens or int(_env_number("MODULELENS_ANTHROPIC_MAX_TOKENS", DEFAULT_MAX_TOKENS, int))
        attempts_allowed = max(1, self._max_attempts or int(
            _env_number("MODULELENS_ANTHROPIC_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS, int)))
        timeout = self._timeout or float(_env_number("MODULELENS_ANTHROPIC_TIMEOUT", DEFAULT_TIMEOUT_S))
        url = f"{self.base_url}/v1/messages"
        headers = {"x-api-key": key, "anthropic-version": API_VERSION, "content-type": "application/json"}
        payload: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "system": system,
            "messages": [{"role": "user", "content": user}],
        }
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        body = json.dumps(payload).encode()

        last = ""
        for attempt in range(1, attempts_allowed + 1):
            try:
                status, resp_headers, resp_body = self.transport.post(url, headers, body, timeout)
            except (OSError, http.client.HTTPException) as e:  # no (complete) response: retry like a 5xx
                status, resp_headers, resp_body = 0, {}, b""
                last = f"could not reach {url}: {e}"
            else:
                if status == 200:
                    return self._parse(resp_body, resp_headers, model, attempt)
                last = f"HTTP {status}: {_api_message(resp_body)}"
                if not (status == 429 or status >= 500):
                    raise ModuleLensError(
                        f"the Anthropic API refused the request ({last})",
                        _STATUS_HINTS.get(status, "fix the request settings above, or use [--provider template]"),
                    )
            if attempt < attempts_allowed:
                self.sleep(self._delay(attempt, resp_headers))
        raise ModuleLensError(
            f"the Anthropic API still failed after {attempts_allowed} attempt(s) ({last})",
            "try again later, raise MODULELENS_ANTHROPIC_MAX_ATTEMPTS, or use [--provider template]",
        )

    def _delay(self, attempt: int, headers: dict[str, str]) -> float:
        retry_after = _header(headers, "retry-after")
        if retry_after:
            try:
                return min(MAX_RETRY_AFTER_S, max(0.0, float(retry_after)))
            except ValueError:
                pass  # an HTTP date: fall back to backoff
        base = min(60.0, 1.0 * 2 ** (attempt - 1))
        return base * (0.5 + 0.5 * self.rng.random())

    def _parse(self, body: bytes, headers: dict[str, str], model: str, attempts: int) -> dict[str, Any]:
        try:
            data = json.loads(body)
            blocks = data.get("content") or []
            text = "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        except (ValueError, AttributeError) as e:
            raise ModuleLensError(f"the Anthropic API sent a response that is not a Messages reply: {e}",
                                  "check ANTHROPIC_BASE_URL points at the Anthropic API")
        usage = data.get("usage") or {}
        tokens_in, tokens_out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
        served = data.get("model") or model
        price = price_per_mtok(served) or price_per_mtok(model)
        cost = None if price is None else round((tokens_in * price[0] + tokens_out * price[1]) / 1e6, 6)
        return {
            "text": text,
            "model": served,
            "requested_model": model,
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "cost_usd": cost,
            "price_per_mtok": None if price is None else {"input": price[0], "output": price[1], "source": price[2]},
            "attempts": attempts,
            "stop_reason": data.get("stop_reason"),
            "request_id": _header(headers, "request-id"),
            "message_id": data.get("id"),
        }
