"""Backend for any OpenAI-compatible HTTP server (vLLM, llama.cpp server, TGI, SGLang).

One pooled ``httpx.AsyncClient`` per tier, created once, on aiohttp's transport; completions go
straight to that transport (see ``_post``). Only failures to connect are retried (a request the
upstream may already be running is never sent twice); read timeouts and 5xx become
``UpstreamError`` (the tier may fall back) and 4xx become ``UpstreamClientError`` (its status
goes back to the client; the upstream's body only to the log). Each error's ``public`` phrase is
all a client reads of it: upstream bodies, exception texts and addresses stay in the log.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from backends.base import UpstreamClientError, UpstreamError, UpstreamResponse, Usage
from backends.config import TierConfig
from backends.json_limits import MAX_JSON_DEPTH, deeper_than
from backends.usage import answer_usage, read_usage


def usage_from(body: dict[str, Any]) -> Usage | None:
    """The answer's reported usage when it is well-formed, else None."""
    usage = read_usage(body.get("usage"))
    return usage if usage is not None and usage.fault is None else None


def _error_body(resp: httpx.Response, raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
        if isinstance(body, dict) and "error" in body:
            return body
    except orjson.JSONDecodeError:
        pass
    text = raw.decode("utf-8", "replace")[:500]
    return {"error": {"message": text or resp.reason_phrase, "type": "upstream_error"}}


ENDPOINTS = ("chat/completions", "completions")
# An upstream answering these refused our credentials, not the request: the tier may fall back.
CREDENTIAL_STATUSES = frozenset({401, 403, 407})


def _connect_failed(exc: BaseException) -> bool:
    """True only when no connection was made, so the upstream cannot have seen the request."""
    cause = exc.__cause__
    return isinstance(exc, httpx.ConnectError) or isinstance(cause, aiohttp.ClientConnectorError)


def _kind(exc: BaseException) -> str:
    """The failure's class in words: what a client may read."""
    cause = exc.__cause__ or exc
    if isinstance(cause, aiohttp.ClientConnectorError) or isinstance(exc, httpx.ConnectError):
        return "unreachable"
    if isinstance(cause, asyncio.TimeoutError | aiohttp.ServerTimeoutError) or isinstance(
        exc, httpx.TimeoutException
    ):
        return "timed out"
    return "connection failed"


def _transport_error(tier: str, exc: BaseException) -> UpstreamError:
    cause = exc.__cause__ or exc
    kind = _kind(exc)
    return UpstreamError(tier, f"{kind}: {type(cause).__name__}: {cause}", public=kind)


class OpenAIHTTPBackend:
    def __init__(self, tier: TierConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        assert tier.base_url, "kind 'openai' tiers have a base_url (checked by the config)"
        self.tier = tier.name
        self.base_url = tier.base_url.rstrip("/")
        self.retries = tier.connect_retries
        headers = {"content-type": "application/json"}
        if tier.api_key_env and os.environ.get(tier.api_key_env):
            headers["authorization"] = f"Bearer {os.environ[tier.api_key_env]}"
        limits = httpx.Limits(
            max_connections=tier.max_inflight + 8,
            max_keepalive_connections=tier.max_inflight + 8,
            keepalive_expiry=30.0,
        )
        timeout = httpx.Timeout(tier.timeout_s, connect=tier.connect_timeout_s, pool=tier.timeout_s)
        self._headers = httpx.Headers(headers)
        self._urls = {e: httpx.URL(f"{self.base_url}/{e}") for e in ENDPOINTS}
        self._extensions = {"timeout": timeout.as_dict()}
        # aiohttp under the httpx API: about half the CPU per request of httpx's own
        # transport, which matters for a proxy (docs/benchmarks.md, "Proxy overhead").
        self._transport = transport or AiohttpTransport(limits=limits)
        # The client owns the transport (closes it) and serves ready(); the hot path skips it.
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=self._transport
        )

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """Send, retrying only when the connection itself failed (never a request the upstream
        may have started)."""
        for attempt in range(self.retries + 1):
            try:
                return await self._post(request)
            except httpx.HTTPError as exc:
                if attempt == self.retries or not _connect_failed(exc):
                    raise _transport_error(self.tier, exc) from exc
                await asyncio.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    async def _post(self, request: httpx.Request) -> httpx.Response:
        """Straight to the transport: the client's auth, redirect and cookie-jar layers do
        nothing for a POST to an upstream we configured, yet cost a tenth of the proxy's CPU
        per request (extracting cookies from every response). The body is read by the caller."""
        response = await self._transport.handle_async_request(request)
        response.request = request
        return response

    def _request(self, endpoint: str, body: dict[str, Any]) -> httpx.Request:
        # Built directly from pre-parsed parts: client.build_request re-parses and merges the
        # base URL on every call, a measurable share of the proxy's CPU per request.
        url = self._urls.get(endpoint) or httpx.URL(f"{self.base_url}/{endpoint}")
        return httpx.Request("POST", url, headers=self._headers, content=orjson.dumps(body),
                             extensions=self._extensions)  # fmt: skip

    async def complete(self, endpoint: str, body: dict[str, Any]) -> UpstreamResponse:
        resp = await self._send(self._request(endpoint, body))
        try:
            raw = await resp.aread()
        except httpx.HTTPError as exc:
            raise _transport_error(self.tier, exc) from exc
        finally:
            await resp.aclose()
        self._check_status(resp, raw)
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(self.tier, "answered with invalid JSON", resp.status_code,
                                public="answered with invalid JSON") from exc
        if not isinstance(answer, dict):
            raise UpstreamError(self.tier, "answered with a non-object JSON body", resp.status_code,
                                public="answered with a non-object JSON body")
        if deeper_than(answer):  # it could not be re-serialised for the client
            raise UpstreamError(self.tier, f"answered JSON nested deeper than {MAX_JSON_DEPTH} "
                                "levels", resp.status_code, public="answered with invalid JSON")
        usage = usage_from(answer)
        if usage is None:  # our own count of a large answer takes long: off the event loop
            usage = await asyncio.to_thread(answer_usage, body, answer)
        return UpstreamResponse(answer, usage)

    def _check_status(self, resp: httpx.Response, raw: bytes) -> None:
        if resp.status_code >= 500:
            message = f"answered {resp.status_code}: {raw[:200].decode('utf-8', 'replace')}"
            raise UpstreamError(self.tier, message, resp.status_code)
        if resp.status_code in CREDENTIAL_STATUSES:
            # The upstream refused the router's own key: the tier is misconfigured, not the
            # request bad, and the client's key is not the one that failed.
            message = f"answered {resp.status_code}: {raw[:200].decode('utf-8', 'replace')}"
            raise UpstreamError(self.tier, message, resp.status_code)
        if resp.status_code >= 400:
            raise UpstreamClientError(resp.status_code, _error_body(resp, raw))

    async def stream(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Raw SSE bytes as they arrive. Errors before the first byte raise, so callers can fall
        back; closing this generator (client gone) closes the upstream connection."""
        resp = await self._send(self._request(endpoint, body))
        # The transport's byte stream, iterated and closed here rather than through
        # resp.aiter_raw(): that wrapper is a second async generator that nothing closes when
        # the relay stops at [DONE], and the event loop's finalizer for each such generator
        # costs a cross-thread wake-up and an extra task per stream.
        chunks = resp.stream.__aiter__()
        try:
            if resp.status_code >= 400:
                self._check_status(resp, await resp.aread())
            async for chunk in chunks:
                yield chunk
        except httpx.HTTPError as exc:
            raise _transport_error(self.tier, exc) from exc
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            await resp.aclose()

    async def ready(self) -> tuple[bool, str]:
        try:
            resp = await self._client.get("/models", timeout=2.0)
        except httpx.HTTPError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return resp.status_code == 200, f"GET /models answered {resp.status_code}"

    async def aclose(self) -> None:
        await self._client.aclose()
