"""One request, step by step:

identify caller -> read + parse + validate body -> choose policy -> score -> decide ->
budget reserve -> backend call (in-flight limit, fallback) -> settle -> trace.

Each step is a small function; ``handle`` reads top to bottom in that order. Everything learnt
along the way lands in a ``Call``, which becomes the response headers and the trace record.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from backends.base import UpstreamClientError, UpstreamError, UpstreamResponse, Usage
from backends.config import TierConfig
from policies.base import RoutingContext
from policies.keys import AuthError, Identity, KeyStoreUnavailable
from policies.selection import Selection, UnknownPolicyError
from router.disconnect import DisconnectWatch, RelayResponse, until_disconnect
from router.errors import RouterError, error_response, json_response
from router.schemas import validate_body
from router.state import RouterState, TierLimiter
from router.stream_relay import StreamMeter, relay
from trace_format.request_text import request_text

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


@dataclass(slots=True)
class Call:
    """What the router learnt about one request; becomes the headers and the trace record."""

    id: str
    endpoint: str
    started: float  # perf_counter
    time: float  # wall clock, for the trace
    stream: bool = False
    identity: Identity | None = None
    requested_model: str | None = None
    selection: Selection | None = None
    score: float | None = None
    tier: str | None = None  # the tier that answered (or was chosen, until one answers)
    reason: str = ""
    model: str | None = None
    tiers_tried: list[str] = field(default_factory=list)
    usage: Usage | None = None
    cost_usd: float | None = None
    status: int = 200
    error: str | None = None
    ttft_ms: float | None = None
    reserved: bool = False
    downgraded: bool = False  # the budget did not fit the chosen tier; a cheaper one answered
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None

    @property
    def policy(self) -> str:
        if self.selection is None:
            return ""
        return self.selection.policy_name or "passthrough"

    def headers(self) -> dict[str, str]:
        h = {"x-router-request-id": self.id}
        if self.tier:
            h["x-router-tier"] = self.tier
        if self.selection is not None:
            h["x-router-policy"] = self.policy
            if self.selection.arm is not None:
                h["x-router-experiment"] = self.selection.experiment or ""
                h["x-router-arm"] = self.selection.arm
        if self.score is not None:
            h["x-router-score"] = f"{self.score:.4f}"
        if self.cost_usd is not None and not self.stream:
            h["x-router-cost-usd"] = f"{self.cost_usd:.9f}"  # the ledger's unit: 1e-9 USD
        if len(self.tiers_tried) > 1:
            h["x-router-fallback-from"] = self.tiers_tried[0]
        if self.downgraded:
            h["x-router-downgraded"] = "true"
        return h

    def trace(self, signals: dict[str, dict[str, float]] | None) -> dict[str, Any]:
        sel, ident, usage = self.selection, self.identity, self.usage
        record: dict[str, Any] = {
            "id": self.id,
            "time": self.time,
            "team": ident.team if ident else None,
            "key_id": ident.key_id if ident else None,
            "user": ident.user if ident else None,
            "policy": self.policy or None,
            "experiment": sel.experiment if sel else None,
            "arm": sel.arm if sel else None,
            "score": self.score,
            "tier": self.tier,
            "model": self.model,
            "requested_model": self.requested_model,
            "reason": self.reason or None,
            "downgraded": self.downgraded,
            "fallback_from": self.tiers_tried[0] if len(self.tiers_tried) > 1 else None,
            "tiers_tried": self.tiers_tried,
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "completion_tokens": usage.completion_tokens if usage else None,
            "cost_usd": self.cost_usd,
            "latency_ms": (time.perf_counter() - self.started) * 1000,
            "ttft_ms": self.ttft_ms,
            "status": self.status,
            "error": self.error,
            "stream": self.stream,
        }
        if self.prompt is not None:
            record["prompt"] = self.prompt
            record["messages"] = self.messages
        if signals:
            record["backend_signals"] = signals
        return record


def new_call(endpoint: str) -> Call:
    return Call(uuid.uuid4().hex, endpoint, time.perf_counter(), time.time())


# --- entry point -------------------------------------------------------------------------------


async def handle(state: RouterState, request: Request, endpoint: str) -> Response:
    call = new_call(endpoint)
    if state.feedback is not None:
        # Every call is traced (finish() runs on success and on failure); registering the id now
        # lets feedback sent right after the response find it before the trace hits the disk.
        state.feedback.remember(call.id)
    try:
        return await _handle(state, request, call)
    except RouterError as err:
        return await _fail(state, call, err.status, err.code, error_response(err, call.headers()))
    except UpstreamClientError as exc:
        # The upstream's own 4xx answer, untouched: the request itself was bad for that model.
        resp = json_response(exc.status, exc.body, call.headers())
        return await _fail(state, call, exc.status, "upstream_client_error", resp)
    except (ClientGone, ClientDisconnect):
        return await _fail(state, call, 499, "client_disconnected", Response(status_code=499))


async def _handle(state: RouterState, request: Request, call: Call) -> Response:
    call.identity = await identify(state, request)
    body = parse_body(await read_body(request, state.config.server.max_body_bytes))
    validate_body(call.endpoint, body)
    call.stream = body.get("stream") is True
    await route(state, call, body, request)
    chain = tier_chain(state, call.tier or "")
    body = state.budgets.bound_body(body)
    # --- budget: reserve (settled or released in finish()/_fail()) ---------------------------
    admitted = await state.budgets.reserve(call.id, call.identity, body, chain, cheaper_tiers(
        state, call))
    call.reserved = True
    chain = admitted.chain
    if admitted.downgraded:
        call.downgraded, call.tier = True, chain[0].name
        call.reason = f"{call.reason}; downgraded to {chain[0].name}: budget".lstrip("; ")
    # -----------------------------------------------------------------------------------------
    if call.stream:
        return await start_stream(state, request, call, body, chain)
    answer = await until_disconnect(request, call_tiers(state, call, body, chain), ClientGone)
    return _answer(state, call, answer)


# --- steps ---------------------------------------------------------------------------------------


async def identify(state: RouterState, request: Request) -> Identity:
    try:
        return await state.keys.authenticate(request.headers.get("authorization"))
    except AuthError as exc:
        raise RouterError(401, exc.code, str(exc)) from None
    except KeyStoreUnavailable as exc:
        raise RouterError(503, "key_store_unavailable", str(exc)) from None


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def _too_large(limit: int) -> RouterError:
    return RouterError(413, "request_too_large", f"request body is larger than {limit} bytes")


def parse_body(raw: bytes) -> Any:
    if not raw:
        raise RouterError(400, "invalid_json", "request body is empty; expected a JSON object")
    try:
        return orjson.loads(raw)  # rejects invalid UTF-8 as well as bad JSON
    except orjson.JSONDecodeError as exc:
        raise RouterError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None


async def route(state: RouterState, call: Call, body: dict[str, Any], request: Request) -> None:
    """Choose the policy (or explicit tier), score the request when a policy needs it, decide."""
    assert call.identity is not None
    model = body["model"]
    call.requested_model = model
    ident = call.identity
    user = body.get("user") if isinstance(body.get("user"), str) else ident.user
    try:
        call.selection = state.selector.select(
            model, team=ident.team, key_id=ident.key_id, user=user, headers=request.headers
        )
    except UnknownPolicyError as exc:
        raise RouterError(404, "model_not_found", str(exc), param="model") from None
    if state.config.traces.include_prompt:
        call.prompt = request_text(body, state.config.classifier.context_turns)
        call.messages = body.get("messages")
    policy = call.selection.policy
    if policy is None:
        call.tier, call.reason = call.selection.tier, "explicit tier"
        return
    t0 = time.perf_counter()
    call.score = state.scorer.score_request(body, state.config.classifier.context_turns)
    state.metrics.classifier_seconds.observe(time.perf_counter() - t0)
    ctx = RoutingContext(
        score=call.score,
        team=ident.team,
        budget=await state.budgets.view(ident),
        load=state.load(),
        now=time.time(),
        unit=call.id,
    )
    decision = policy.decide(ctx)
    call.tier, call.reason = decision.tier, decision.reason


def cheaper_tiers(state: RouterState, call: Call) -> list[TierConfig]:
    """Tiers the budget may downgrade to: the policy's own tiers (never for an explicit tier)."""
    policy = call.selection.policy if call.selection is not None else None
    if policy is None:
        return []
    return [state.tiers[n] for n in policy.tiers() if n != call.tier and n in state.tiers]


def tier_chain(state: RouterState, first: str) -> list[TierConfig]:
    """The chosen tier, then its configured fallbacks in order."""
    tier = state.tiers[first]
    chain = [tier]
    for name in tier.fallback:
        if name != first and state.tiers[name] not in chain:
            chain.append(state.tiers[name])
    return chain


def upstream_body(body: dict[str, Any], tier: TierConfig, stream: bool) -> dict[str, Any]:
    out = {**body, "model": tier.model}
    if stream:
        # Always ask for usage: budgets are charged from it. The relay strips it again when the
        # client did not ask.
        out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return out


class _Attempts:
    """Why each tier of the chain did not answer; turned into one client error at the end."""

    def __init__(self) -> None:
        self.saturated: list[str] = []
        self.failed: list[UpstreamError] = []

    async def admit(self, state: RouterState, call: Call, tier: TierConfig) -> TierLimiter | None:
        """Try the tier: its limiter, acquired (the caller releases it), or None when it is full."""
        call.tiers_tried.append(tier.name)
        limiter = state.limiters[tier.name]
        if await limiter.acquire():
            return limiter
        self.saturated.append(tier.name)
        return None

    def failure(self, call: Call, tier: TierConfig, exc: UpstreamError) -> None:
        log.warning("tier %s failed for %s: %s", tier.name, call.id, exc)
        self.failed.append(exc)

    def error(self) -> RouterError:
        if not self.failed:
            tiers = ", ".join(self.saturated)
            return RouterError(429, "rate_limited", f"all tiers are at capacity ({tiers}); retry",
                               headers={"retry-after": "1"})  # fmt: skip
        detail = "; ".join(str(e) for e in self.failed)
        if any(e.status is not None for e in self.failed):
            return RouterError(502, "upstream_error", f"upstream failed: {detail}")
        return RouterError(503, "upstream_unavailable", f"no tier could answer: {detail}")


async def call_tiers(
    state: RouterState, call: Call, body: dict[str, Any], chain: list[TierConfig]
) -> tuple[TierConfig, UpstreamResponse]:
    attempts = _Attempts()
    for tier in chain:
        if (limiter := await attempts.admit(state, call, tier)) is None:
            continue
        t0 = time.perf_counter()
        try:
            answer = await state.backends[tier.name].complete(
                call.endpoint, upstream_body(body, tier, False)
            )
        except UpstreamError as exc:
            attempts.failure(call, tier, exc)
            continue
        finally:
            limiter.release()
        state.metrics.upstream_seconds.labels(tier.name, "false").observe(time.perf_counter() - t0)
        _note_fallback(state, call, tier)
        return tier, answer
    raise attempts.error()


def _note_fallback(state: RouterState, call: Call, tier: TierConfig) -> None:
    if call.tiers_tried[0] != tier.name:
        state.metrics.fallbacks.labels(call.tiers_tried[0], tier.name).inc()
    call.tier = tier.name


def _answer(
    state: RouterState, call: Call, result: tuple[TierConfig, UpstreamResponse]
) -> Response:
    tier, answer = result
    call.usage = answer.usage
    call.cost_usd = tier.price.cost(answer.usage.prompt_tokens, answer.usage.completion_tokens)
    model = answer.body.get("model")
    call.model = model if isinstance(model, str) else tier.model
    state.spawn(finish(state, call))
    return json_response(200, answer.body, call.headers())


# --- streaming -----------------------------------------------------------------------------------


async def start_stream(
    state: RouterState, request: Request, call: Call, body: dict[str, Any], chain: list[TierConfig]
) -> Response:
    """Open the first tier that yields a first byte; only then commit to a 200 stream, so a tier
    that fails before answering still falls back. One disconnect watch covers the wait for the
    first byte and then the relay (the response takes it over)."""
    watch = DisconnectWatch(request.receive)
    try:
        return await _open_stream(state, call, body, chain, watch)
    except BaseException:
        watch.close()
        raise


async def _open_stream(
    state: RouterState, call: Call, body: dict[str, Any], chain: list[TierConfig],
    watch: DisconnectWatch,
) -> Response:  # fmt: skip
    attempts = _Attempts()
    for tier in chain:
        if (limiter := await attempts.admit(state, call, tier)) is None:
            continue
        t0 = time.perf_counter()
        upstream = state.backends[tier.name].stream(call.endpoint, upstream_body(body, tier, True))
        try:
            first = await watch.guard(_first_bytes(upstream, tier), ClientGone)
        except UpstreamError as exc:
            limiter.release()
            attempts.failure(call, tier, exc)
            continue
        except BaseException:
            limiter.release()
            await upstream.aclose()
            raise
        call.ttft_ms = (time.perf_counter() - call.started) * 1000
        state.metrics.upstream_seconds.labels(tier.name, "true").observe(time.perf_counter() - t0)
        _note_fallback(state, call, tier)
        want = bool((body.get("stream_options") or {}).get("include_usage"))
        meter = StreamMeter(request=body, want_usage=want)
        parts = _client_stream(state, call, tier, upstream, first, meter, limiter.release)
        return RelayResponse(parts, headers=call.headers(), watch=watch)
    raise attempts.error()


async def _first_bytes(upstream: AsyncIterator[bytes], tier: TierConfig) -> bytes:
    try:
        return await anext(upstream)
    except StopAsyncIteration:
        raise UpstreamError(tier.name, "closed the stream before sending anything") from None


async def _client_stream(
    state: RouterState,
    call: Call,
    tier: TierConfig,
    upstream: AsyncIterator[bytes],
    first: bytes,
    meter: StreamMeter,
    release: Callable[[], None],
) -> AsyncIterator[tuple[bytes, bool]]:
    def cost_of(usage: Usage) -> float:
        return tier.price.cost(usage.prompt_tokens, usage.completion_tokens)

    try:
        async for part in relay(first, upstream, meter, cost_of):
            yield part
        if meter.error:
            call.status, call.error = 502, meter.error
    except BaseException:
        call.status, call.error = 499, "client_disconnected"
        raise
    finally:
        release()
        await upstream.aclose()  # no-op when finished; otherwise closes the upstream connection
        call.usage = meter.final_usage()
        call.cost_usd = cost_of(call.usage)
        call.model = meter.model or tier.model
        state.spawn(finish(state, call))


# --- end of a request ----------------------------------------------------------------------------


async def finish(state: RouterState, call: Call) -> None:
    """Settle the budget, count metrics, write the trace. Runs after the response is sent."""
    usage = call.usage
    # --- budget: settle ----------------------------------------------------------------------
    if call.reserved:
        if usage is not None and call.cost_usd is not None:
            tokens = usage.prompt_tokens + usage.completion_tokens
            await state.budgets.settle(call.id, call.cost_usd, tokens)
        else:
            await state.budgets.release(call.id)
    # -----------------------------------------------------------------------------------------
    m = state.metrics
    m.requests.labels(call.tier or "", call.policy, str(call.status)).inc()
    if call.error:
        m.errors.labels(call.error).inc()
    if usage is not None and call.tier:
        m.tokens.labels(call.tier, "prompt").inc(usage.prompt_tokens)
        m.tokens.labels(call.tier, "completion").inc(usage.completion_tokens)
    if call.cost_usd and call.tier:
        team = call.identity.team if call.identity else ""
        m.cost_usd.labels(call.tier, team).inc(call.cost_usd)
    sel = call.selection
    if sel is not None and sel.experiment is not None and sel.arm is not None:
        status = str(call.status)
        m.experiment_requests.labels(sel.experiment, sel.arm, call.tier or "", status).inc()
        if call.cost_usd:
            m.experiment_cost_usd.labels(sel.experiment, sel.arm).inc(call.cost_usd)
    if state.traces is not None:
        signals = state.signals.trace_signals() if state.signals is not None else None
        state.traces.write(call.trace(signals))


async def _fail(state: RouterState, call: Call, status: int, code: str, resp: Response) -> Response:
    call.status, call.error = status, code
    call.usage, call.cost_usd = None, None
    state.spawn(finish(state, call))
    return resp

