"""Backend for any OpenAI-compatible HTTP server (vLLM, llama.cpp server, TGI, SGLang).

One pooled ``httpx.AsyncClient`` per tier, created once, on aiohttp's transport; completions go
straight to that transport (see ``_post``). Only failures to connect are retried (a request the
upstream may already be running is never sent twice); read timeouts and 5xx become
``UpstreamError`` (the tier may fall back) and 4xx become ``UpstreamClientError`` (its status
goes back to the client; the upstream's body only to the log), as does a 5xx that the tier's
server kind is known to answer to an invalid request (llama-cpp-python's validation errors,
backends/normalize.py: 400, no fallback). Bodies are rewritten for what the tier's server kind is
known to reject (backends/normalize.py) just before they are sent. Each error's ``public`` phrase is
all a client reads of it: upstream bodies, exception texts and addresses stay in the log.

A tier that lists `deployments` gets one pool per server and a `DeploymentSet`
(backends/deployments.py) that picks the server of each attempt; an attempt that fails (cannot
connect, times out, 5xx, or a stream that ends before its first byte) is tried on another
deployment of the tier before the request path falls back to another tier, so the request's one
budget reservation covers all of it. There the other deployments are the retry: a failed connect
is not retried on the same server. Active probes (backends/signal_deployments.py) start with the
first request on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from backends.base import UpstreamClientError, UpstreamError, UpstreamResponse, Usage
from backends.config import TierConfig
from backends.deployments import Deployment, DeploymentsBusy, DeploymentSet, deployments_of
from backends.json_limits import MAX_JSON_DEPTH, deeper_than
from backends.normalize import invalid_request, normalizer, server_kind
from backends.signal_deployments import DeploymentProber
from backends.usage import answer_usage, read_answer_usage, read_usage

log = logging.getLogger(__name__)


def usage_from(body: dict[str, Any]) -> Usage | None:
    """The answer's reported usage when it is well-formed, else None."""
    usage = read_usage(body.get("usage"), body.get("timings"))
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


ENDPOINTS = ("chat/completions", "completions", "messages", "responses")
ANTHROPIC_VERSION = "2023-06-01"  # the Messages API version the router speaks
# Client APIs passed through as they are (`apis:`): the engine rewrites (backends/normalize.py)
# are for chat and completions bodies.
CLIENT_API_ENDPOINTS = frozenset({"messages", "responses"})
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


def _all_failed(tier: str, errors: list[tuple[str, UpstreamError]]) -> UpstreamError:
    """One error for a tier whose deployments all failed this request, naming each (for the log
    and the trace); its status and public phrase are the last one's."""
    if not errors:
        return DeploymentsBusy(tier)
    last = errors[-1][1]
    detail = "; ".join(
        f"deployment {name}: {str(e).removeprefix(f'{tier}: ')}" for name, e in errors
    )
    return UpstreamError(tier, detail, last.status, public=last.public)


def _unreachable(exc: UpstreamError) -> bool:
    """The attempt failed to connect at all: nothing listens at that deployment."""
    return exc.__cause__ is not None and _connect_failed(exc.__cause__)


class _Server:
    """One upstream server: its URLs, headers and connection pool."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        max_inflight: int,
        tier: TierConfig,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        limits = httpx.Limits(
            max_connections=max_inflight + 8,
            max_keepalive_connections=max_inflight + 8,
            keepalive_expiry=30.0,
        )
        timeout = httpx.Timeout(tier.timeout_s, connect=tier.connect_timeout_s, pool=tier.timeout_s)
        self.headers = httpx.Headers(headers)
        # A tier that speaks Anthropic Messages (`apis: [messages]`) is sent them as they are:
        # Anthropic's own server wants its version header and the key as x-api-key (vLLM and
        # llama.cpp take the bearer key and ignore both).
        messages = {**headers, "anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            messages["x-api-key"] = api_key
        self.endpoint_headers = {"messages": httpx.Headers(messages)}
        self.urls = {e: httpx.URL(f"{self.base_url}/{e}") for e in ENDPOINTS}
        self.extensions = {"timeout": timeout.as_dict()}
        # aiohttp under the httpx API: about half the CPU per request of httpx's own
        # transport, which matters for a proxy (docs/benchmarks.md, "Proxy overhead").
        self.transport = transport or AiohttpTransport(limits=limits)
        # The client owns the transport (closes it) and serves ready(); the hot path skips it.
        self.client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=self.transport
        )

    async def post(self, request: httpx.Request) -> httpx.Response:
        """Straight to the transport: the client's auth, redirect and cookie-jar layers do
        nothing for a POST to an upstream we configured, yet cost a tenth of the proxy's CPU
        per request (extracting cookies from every response). The body is read by the caller."""
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response

    def request(self, endpoint: str, body: dict[str, Any]) -> httpx.Request:
        # Built directly from pre-parsed parts: client.build_request re-parses and merges the
        # base URL on every call, a measurable share of the proxy's CPU per request.
        url = self.urls.get(endpoint) or httpx.URL(f"{self.base_url}/{endpoint}")
        return httpx.Request(
            "POST",
            url,
            headers=self.endpoint_headers.get(endpoint, self.headers),
            content=orjson.dumps(body),
            extensions=self.extensions,
        )

    async def ready(self) -> tuple[bool, str]:
        try:
            resp = await self.client.get("/models", timeout=2.0)
        except httpx.HTTPError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return resp.status_code == 200, f"GET /models answered {resp.status_code}"


def _env_key(name: str | None) -> str | None:
    return os.environ.get(name) or None if name else None


class OpenAIHTTPBackend:
    def __init__(self, tier: TierConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        assert tier.base_url or tier.deployments, "checked by the config (backends/registry.py)"
        self.tier = tier.name
        self.retries = tier.connect_retries
        self.server_kind = server_kind(tier)
        self._normalize = normalizer(tier)
        self.deployments: DeploymentSet | None = None
        self._prober: DeploymentProber | None = None
        if tier.deployments:
            self._servers = [
                _Server(
                    d.base_url,
                    d.api_key or _env_key(d.api_key_env or tier.api_key_env),
                    d.max_inflight,
                    tier,
                    transport,
                )
                for d in tier.deployments
            ]
            self.deployments = DeploymentSet(
                tier.name, deployments_of(tier.deployments), tier.balancing
            )
            if tier.balancing.probe_interval_s > 0:
                self._prober = DeploymentProber(
                    self.deployments,
                    tier.balancing.probe_interval_s,
                    tier.balancing.probe_timeout_s,
                    tier.balancing.health_path,
                )
        else:
            assert tier.base_url
            self._servers = [
                _Server(
                    tier.base_url, _env_key(tier.api_key_env), tier.max_inflight, tier, transport
                )
            ]
        self._server = self._servers[0]
        self.base_url = self._server.base_url

    async def _send(self, server: _Server, request: httpx.Request, retries: int) -> httpx.Response:
        """Send, retrying only when the connection itself failed (never a request the upstream
        may have started)."""
        for attempt in range(retries + 1):
            try:
                return await server.post(request)
            except httpx.HTTPError as exc:
                if attempt == retries or not _connect_failed(exc):
                    raise _transport_error(self.tier, exc) from exc
                await asyncio.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    def _probing(self) -> None:
        # Started here, on the event loop that serves requests (backends have no start()).
        if self._prober is not None and not self._prober.running:
            self._prober.start()

    async def complete(self, endpoint: str, body: dict[str, Any]) -> UpstreamResponse:
        if self._normalize is not None and endpoint not in CLIENT_API_ENDPOINTS:
            body = self._normalize(body)
        if self.deployments is None:
            return await self._complete_on(self._server, endpoint, body, self.retries)
        self._probing()
        tried: list[Deployment] = []
        errors: list[tuple[str, UpstreamError]] = []
        while (d := self.deployments.pick(tried)) is not None:
            tried.append(d)
            d.inflight += 1
            try:
                answer = await self._complete_on(self._servers[d.index], endpoint, body, 0)
            except UpstreamError as exc:
                self._failed(d, exc)
                errors.append((d.name, exc))
                continue
            finally:
                d.inflight -= 1
            self.deployments.succeeded(d)
            answer.deployment = d.name
            return answer
        raise _all_failed(self.tier, errors)

    def _failed(self, d: Deployment, exc: UpstreamError) -> None:
        assert self.deployments is not None
        log.warning("tier %s: deployment %s failed: %s", self.tier, d.name, exc)
        self.deployments.failed(d, unreachable=_unreachable(exc))

    async def _complete_on(
        self, server: _Server, endpoint: str, body: dict[str, Any], retries: int
    ) -> UpstreamResponse:
        resp = await self._send(server, server.request(endpoint, body), retries)
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
            raise UpstreamError(
                self.tier,
                "answered with invalid JSON",
                resp.status_code,
                public="answered with invalid JSON",
            ) from exc
        if not isinstance(answer, dict):
            raise UpstreamError(
                self.tier,
                "answered with a non-object JSON body",
                resp.status_code,
                public="answered with a non-object JSON body",
            )
        if deeper_than(answer):  # it could not be re-serialised for the client
            raise UpstreamError(
                self.tier,
                f"answered JSON nested deeper than {MAX_JSON_DEPTH} levels",
                resp.status_code,
                public="answered with invalid JSON",
            )
        usage = read_answer_usage(endpoint, answer)  # in the shape of the API it was sent
        if usage is None or usage.fault is not None:
            # Our own count of a large answer takes long: off the event loop.
            usage = await asyncio.to_thread(answer_usage, body, answer, endpoint)
        return UpstreamResponse(answer, usage)

    def _check_status(self, resp: httpx.Response, raw: bytes) -> None:
        if resp.status_code >= 500 and self.server_kind is not None:
            body = _error_body(resp, raw)
            if invalid_request(self.server_kind, resp.status_code, body):
                # The request itself is invalid (its status only says the server failed):
                # another tier or a client retry would be sent the same bad request.
                raise UpstreamClientError(400, body)
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

    def stream(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Raw SSE bytes as they arrive. Errors before the first byte raise, so callers can fall
        back; closing this iterator (client gone) closes the upstream connection. With several
        deployments, the iterator names the one that answered (`deployment`) once its first
        bytes came."""
        if self._normalize is not None and endpoint not in CLIENT_API_ENDPOINTS:
            body = self._normalize(body)
        if self.deployments is None:
            return self._stream_on(self._server, endpoint, body, self.retries, None)
        self._probing()
        return _BalancedStream(self, self.deployments, endpoint, body)

    async def _stream_on(
        self,
        server: _Server,
        endpoint: str,
        body: dict[str, Any],
        retries: int,
        d: Deployment | None,
    ) -> AsyncIterator[bytes]:
        if d is not None:
            d.inflight += 1  # paired with the finally below: the generator runs to it
        try:
            resp = await self._send(server, server.request(endpoint, body), retries)
        except BaseException:
            if d is not None:
                d.inflight -= 1
            raise
        # The transport's byte stream, iterated and closed here rather than through
        # resp.aiter_raw(): that wrapper is a second async generator that nothing closes when
        # the relay stops at [DONE], and the event loop's finalizer for each such generator
        # costs a cross-thread wake-up and an extra task per stream.
        chunks = resp.stream.__aiter__()
        sent = False
        try:
            if resp.status_code >= 400:
                self._check_status(resp, await resp.aread())
            async for chunk in chunks:
                yield chunk
                sent = True
        except httpx.HTTPError as exc:
            error = _transport_error(self.tier, exc)
            if d is not None and sent:  # cut mid-stream: a failure too (before: _BalancedStream)
                self._failed(d, error)
            raise error from exc
        finally:
            if d is not None:
                d.inflight -= 1
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
            await resp.aclose()

    async def ready(self) -> tuple[bool, str]:
        if self.deployments is None:
            return await self._server.ready()
        self._probing()
        results = await asyncio.gather(*(s.ready() for s in self._servers))
        names = [d.name for d in self.deployments.deployments]
        detail = "; ".join(f"{n}: {why}" for n, (_, why) in zip(names, results, strict=True))
        return any(ok for ok, _ in results), detail  # one server up serves the tier

    async def aclose(self) -> None:
        if self._prober is not None:
            await self._prober.stop()
        for server in self._servers:
            await server.client.aclose()


class _BalancedStream:
    """A stream on one deployment of a tier: the first `__anext__` picks deployments until one
    sends its first bytes (another one is tried when a deployment fails before answering), then
    every chunk comes straight from that deployment's stream (no extra layer per chunk)."""

    __slots__ = ("_backend", "_set", "_endpoint", "_body", "_inner", "deployment")

    def __init__(
        self,
        backend: OpenAIHTTPBackend,
        deployments: DeploymentSet,
        endpoint: str,
        body: dict[str, Any],
    ) -> None:
        self._backend, self._set = backend, deployments
        self._endpoint, self._body = endpoint, body
        self._inner: AsyncIterator[bytes] | None = None
        self.deployment: str | None = None

    def __aiter__(self) -> _BalancedStream:
        return self

    def __anext__(self) -> Awaitable[bytes]:
        inner = self._inner
        return self._open() if inner is None else inner.__anext__()

    async def _open(self) -> bytes:
        backend = self._backend
        tried: list[Deployment] = []
        errors: list[tuple[str, UpstreamError]] = []
        while (d := self._set.pick(tried)) is not None:
            tried.append(d)
            upstream = backend._stream_on(
                backend._servers[d.index], self._endpoint, self._body, 0, d
            )
            try:
                first = await anext(upstream)
            except StopAsyncIteration:
                closed = UpstreamError(backend.tier, "closed the stream before sending anything")
                backend._failed(d, closed)
                errors.append((d.name, closed))
                continue
            except UpstreamError as exc:
                backend._failed(d, exc)
                errors.append((d.name, exc))
                continue
            self._set.succeeded(d)
            self._inner, self.deployment = upstream, d.name
            return first
        raise _all_failed(backend.tier, errors)

    async def aclose(self) -> None:
        inner = self._inner
        if inner is not None:
            aclose = getattr(inner, "aclose", None)
            if aclose is not None:
                await aclose()
