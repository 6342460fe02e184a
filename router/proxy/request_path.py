"""One request, step by step:

identify caller -> read + parse + validate body -> choose policy -> score -> decide ->
budget reserve -> backend call (in-flight limit, fallback) -> settle -> trace.

Each step is a small function; ``handle`` reads top to bottom in that order. Everything learnt
along the way lands in a ``Call``, which becomes the response headers and the trace record.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from backends.base import UpstreamClientError, UpstreamError, UpstreamResponse, Usage
from backends.config import TierConfig
from backends.deployments import DeploymentsBusy
from backends.json_limits import MAX_JSON_DEPTH, deeper_than
from backends.usage import counted_answer_usage, counted_usage, usage_json
from policies.base import Decision, Policy, RoutingContext
from policies.context_window import REASON as CONTEXT_REASON
from policies.context_window import ContextNeed, context_need, fit_tier, fits, refusal_message
from policies.keys import AuthError, Identity, KeyStoreUnavailable
from policies.selection import Selection, UnknownPolicyError
from policies.sessions.identity import SessionKey
from policies.sessions.store import StepReserved
from policies.spec import tiers_by_price
from router.apis.base import ClientApi
from router.http.body_limits import body_timed_out
from router.http.errors import RouterError, error_body, json_response
from router.http.schemas import validate_body
from router.observability.telemetry_config import NO_MARKS, Marks, StepMarks, caller_trace
from router.proxy.disconnect import DisconnectWatch, RelayResponse, until_disconnect
from router.proxy.limiter import TierLimiter
from router.proxy.messages_relay import messages_meter, relay_messages
from router.proxy.responses_relay import relay_responses, responses_meter
from router.proxy.session_step import (
    CLIENT_TIER,
    PendingStep,
    SessionInfo,
    prepare,
    session_key,
    step_reserving,
)
from router.proxy.state import RouterState
from router.proxy.stream_relay import StreamMeter, relay
from router.proxy.usage_guard import Priced, checked_usage, priced
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
    deployment: str | None = None  # which of that tier's deployments answered (if it lists some)
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
    # What the request needs of a context window (only while some tier sets one), and the chosen
    # tier that could not hold it (fit_context_window).
    context_tokens: int | None = None
    context_from: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    body: dict[str, Any] | None = None  # as sent upstream; read by shadow comparisons
    reserved_nanos: int = 0  # the reservation: no charge is above it
    actual_cost_usd: float | None = None  # the usage's cost before that cap (settle: overage)
    error_detail: str | None = None  # what broke a stream, for the trace (never the client)
    answer: Any = None  # the answer body, or a stream's content events (shadow comparisons)
    finishing: bool = False  # finish() is queued: a later failure amends the call, not a 2nd run
    # Where the steps started and ended: noted only while tracing is on (a no-op otherwise);
    # router/observability/telemetry.py builds the spans from them in finish().
    marks: Marks = NO_MARKS
    trace_parent: dict[str, str] | None = None  # the caller's W3C trace context headers
    session: SessionInfo | None = None  # the conversation and why its rules kept or moved it
    pending: PendingStep | None = None  # its step, taken with the budget reserve (`admit`)
    # The client API when it is not `endpoint` (Messages, Responses: router/apis/): the request
    # runs as the chat request `api.to_chat` made, and `upstream_endpoint` is what the tier
    # that answered was sent (the client's own API when it speaks it, else chat).
    api: ClientApi | None = None
    upstream_endpoint: str | None = None
    upstream_request: dict[str, Any] | None = None  # the body sent there, when not `body`

    def error_body(
        self, status: int, code: str, message: str, param: str | None = None
    ) -> dict[str, Any]:
        """The error JSON of the API the client called."""
        if self.api is not None:
            return self.api.error_body(status, code, message, param)
        return error_body(status, code, message, param)

    def error_response(self, err: RouterError) -> Response:
        body = self.error_body(err.status, err.code, err.message, err.param)
        return json_response(err.status, body, {**err.headers, **self.headers()})

    @property
    def policy(self) -> str:
        if self.selection is None:
            return ""
        return self.selection.policy_name or "passthrough"

    def hold(self, reserved_nanos: int) -> None:
        """The budget reservation is made: finish() settles or releases it."""
        self.reserved, self.reserved_nanos = True, reserved_nanos

    def downgrade_to(self, tier: str) -> None:
        """The budget did not fit the chosen tier: the cheaper `tier` answers instead."""
        self.downgraded, self.tier = True, tier
        self.reason = f"{self.reason}; downgraded to {tier}: budget".lstrip("; ")

    def charge(self, usage: Usage, cost: Priced, model: str, answer: Any) -> None:
        """The answer, once known (a stream's at its end): what it used, cost and said."""
        self.usage, self.cost_usd, self.actual_cost_usd = usage, cost.cost_usd, cost.actual_usd
        self.model, self.answer = model, answer

    def fail(self, status: int, code: str) -> None:
        """The request ends in an error: nothing is charged (finish() releases)."""
        self.status, self.error = status, code
        self.usage, self.cost_usd, self.actual_cost_usd = None, None, None

    def headers(self) -> dict[str, str]:
        h = {"x-router-request-id": self.id}
        if self.tier and self.tiers_tried:  # refused before any tier (budget): no tier header
            h["x-router-tier"] = self.tier
        if self.deployment is not None:
            h["x-router-deployment"] = self.deployment
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
        if self.context_from is not None:
            h["x-router-context-window"] = f"moved from {self.context_from}"
        if self.session is not None:
            h["x-router-session"] = self.session.header()
        return h

    def trace(self, signals: dict[str, dict[str, float]] | None) -> dict[str, Any]:
        sel, ident, usage = self.selection, self.identity, self.usage
        record: dict[str, Any] = {
            "id": self.id,
            "time": self.time,
            "endpoint": self.api.name if self.api is not None else self.endpoint,
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
            # What the cost priced as cache reads, cache writes (the rest of the prompt fresh)
            # and reasoning (part of the completion): 0 for our own count.
            "cached_tokens": usage.cached_tokens if usage else None,
            "cache_write_tokens": usage.cache_write_tokens if usage else None,
            "reasoning_tokens": usage.reasoning_tokens if usage else None,
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
            meta = (self.body or {}).get("metadata")
            if isinstance(meta, dict):  # what `distill export --tag` selects a workflow by
                record["metadata"] = meta
        if signals:
            record["backend_signals"] = signals
        if usage is not None and usage.fault is not None:
            record["usage_fault"] = usage.fault
        if usage is not None and not usage.reported:
            record["usage_estimated"] = True
        if self.error_detail is not None:
            record["error_detail"] = self.error_detail
        if self.deployment is not None:
            record["deployment"] = self.deployment
        if self.api is not None and self.upstream_endpoint is not None:
            record["upstream_endpoint"] = self.upstream_endpoint
        if sel is not None and sel.workflow is not None:
            record["workflow"] = sel.workflow.name
        if sel is not None and sel.unit:
            # What assigned the arm (the body's `user` is not the key's `user` above): the unit
            # the A/B report resamples (simulations/ab_report.py).
            record["ab_unit"], record["ab_unit_id"] = sel.unit, sel.unit_id
        if self.session is not None:
            record["session"] = self.session.key.id
            record["turn"] = self.session.key.turn
            record["session_reason"] = self.session.reason
            if self.session.quote is not None:
                record["session_prompt_tokens"], record["session_prefix_tokens"] = (
                    self.session.quote
                )
        return record


def new_call(endpoint: str) -> Call:
    return Call(uuid.uuid4().hex, endpoint, time.perf_counter(), time.time())


# --- entry point -------------------------------------------------------------------------------


# The steps of one endpoint, between identifying nothing yet and an answer: `_handle` (chat and
# completions) unless the endpoint brings its own (router/endpoints/embeddings.py).
Steps = Callable[[RouterState, Request, Call], Awaitable[Response]]


async def handle(
    state: RouterState,
    request: Request,
    endpoint: str,
    steps: Steps | None = None,
    api: ClientApi | None = None,
) -> Response:
    """`api`: the client API when it is not `endpoint` (router/apis/base.py): the request runs
    as `endpoint` (chat completions) on the body `api.to_chat` makes of the client's, and every
    error leaves in the API's own shape."""
    call = new_call(endpoint)
    call.api = api
    if state.telemetry is not None:  # with tracing off, this test is all a request pays
        call.marks, call.trace_parent = StepMarks(), caller_trace(request.headers)
    # Every way out below ends in finish() (through _fail here, or the answer's own path), which
    # settles or releases a reservation: one held by a request that died would be renewed for as
    # long as the replica runs, and drain the team's budget.
    try:
        return await (steps or _handle)(state, request, call)
    except RouterError as err:
        return await _fail(state, call, err.status, err.code, call.error_response(err))
    except UpstreamClientError as exc:
        # The request was bad for that model: its status, not its body, which may carry the
        # upstream's internals (logged for the operator).
        call.error_detail = f"upstream answered {exc.status}: {str(exc.body)[:2000]}"
        log.warning("upstream rejected %s: %s", call.id, call.error_detail)
        code = "upstream_client_error"
        message = exc.public or (
            f"the model server rejected the request ({exc.status}); the "
            f"router's log has the details under request id {call.id}"
        )
        resp = json_response(exc.status, call.error_body(exc.status, code, message), call.headers())
        return await _fail(state, call, exc.status, code, resp)
    except (ClientGone, ClientDisconnect):
        return await _fail(state, call, 499, "client_disconnected", Response(status_code=499))
    except asyncio.CancelledError:
        # Shutdown cancelled the request: still settle what it reserved, then let it unwind.
        if call.reserved:
            await _fail(state, call, 499, "cancelled", Response(status_code=499))
        raise
    except Exception:  # noqa: BLE001 - a bug of ours: never a held reservation or a stack trace
        log.exception("unexpected error in request %s", call.id)
        body = call.error_body(
            500, "internal_error", f"internal error in the router (request id {call.id})"
        )
        return await _fail(
            state, call, 500, "internal_error", json_response(500, body, call.headers())
        )
    finally:
        if state.feedback is not None and call.identity is not None:
            # Before the response leaves: feedback sent right after it finds the id (and the
            # team that alone may rate it) before the trace hits the disk.
            state.feedback.remember(call.id, call.identity.team)


async def _handle(state: RouterState, request: Request, call: Call) -> Response:
    api = call.api
    call.identity = await identify(state, request, api)
    body = parse_body(await read_body(request, state.limits.max_body_bytes))
    if api is not None:  # the client's API checked and translated: from here on, a chat request
        body = api.to_chat(body)
    validate_body(call.endpoint, body)
    call.stream = body.get("stream") is True
    call.marks.start("route")
    await route(state, call, body, request)
    call.marks.end("route", then="budget")
    # What the upstream gets carries exactly the bound that is reserved, in the field(s) the
    # endpoint obeys. Where that bound came from is read first, for a refusal to name it.
    bound_from = state.budgets.bound_source(body, call.endpoint)
    sent = state.budgets.bound_body(body, call.endpoint)
    call.body = sent
    # --- budget: reserve (settled or released in finish()/_fail(), whatever happens next) ------
    first = await _ride(state, call, body, sent) if call.pending is not None else None
    chain = tier_chain(state, call.tier or "", call.context_tokens)
    admitted = await state.budgets.reserve(
        call.id,
        call.identity,
        sent,
        chain,
        cheaper_tiers(state, call),
        endpoint=call.endpoint,
        bound_from=bound_from,
        first=first,
    )
    body = sent
    call.hold(admitted.reserved_nanos)
    call.marks.end("budget")
    chain = within_window(admitted.chain, call.context_tokens)  # a downgrade's fallbacks too
    if admitted.downgraded:
        state.metrics.downgrades.labels(call.tier or "", chain[0].name).inc()
        call.downgrade_to(chain[0].name)
    # -----------------------------------------------------------------------------------------
    if call.stream:
        return await start_stream(state, request, call, body, chain)
    answer = await until_disconnect(request, call_tiers(state, call, body, chain), ClientGone)
    return _answer(state, call, answer)


# --- steps ---------------------------------------------------------------------------------------


async def identify(state: RouterState, request: Request, api: ClientApi | None = None) -> Identity:
    """The caller's key: `Authorization: Bearer`, or where the client API takes its key."""
    headers = request.headers
    auth = api.authorization(headers) if api is not None else headers.get("authorization")
    try:
        return await state.keys.authenticate(auth)
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
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            parts.append(chunk)
    except ClientDisconnect:
        if body_timed_out(request.scope):  # the server answered 408 and closed: trace it so
            message = "the request body did not arrive within server.body_timeout_s"
            raise RouterError(408, "request_timeout", message) from None
        raise
    return b"".join(parts)


def _too_large(limit: int) -> RouterError:
    return RouterError(413, "request_too_large", f"request body is larger than {limit} bytes")


def parse_body(raw: bytes) -> Any:
    if not raw:
        raise RouterError(400, "invalid_json", "request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)  # rejects invalid UTF-8 as well as bad JSON
    except orjson.JSONDecodeError as exc:
        raise RouterError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None
    if deeper_than(body):  # before anything is reserved: re-sent upstream, it would fail
        raise RouterError(
            400, "invalid_json", f"request body is nested deeper than {MAX_JSON_DEPTH} levels"
        )
    return body


async def route(state: RouterState, call: Call, body: dict[str, Any], request: Request) -> None:
    """Choose the policy (or explicit tier), score the request when a policy needs it, decide."""
    assert call.identity is not None
    model = body["model"]
    call.requested_model = model
    ident = call.identity
    user = body.get("user") if isinstance(body.get("user"), str) else ident.user
    session = session_key(request.headers, body, ident.team)  # a hash of the prefix: no I/O
    try:
        call.selection = state.selector.select(
            model,
            team=ident.team,
            key_id=ident.key_id,
            user=user,
            headers=request.headers,
            session=session.id if session is not None else None,
        )
    except UnknownPolicyError as exc:
        raise RouterError(404, "model_not_found", str(exc), param="model") from None
    limits = state.limits
    if limits.include_prompt:
        call.prompt = request_text(body, limits.context_turns)
        call.messages = body.get("messages")
    policy = call.selection.policy
    if policy is None:
        call.tier, call.reason = call.selection.tier, "explicit tier"
        if session is not None:  # a tier the client named is never changed
            call.session = SessionInfo(session, "none", CLIENT_TIER)
        fit_context_window(state, call, body, [call.tier], pinned=True)
        return
    workflow = state.selector.workflow(call.policy, ident.team, body)
    if workflow is not None:  # its tier whatever the score (policies/workflow.py): none taken
        call.selection = replace(call.selection, workflow=workflow)
        decision = Decision(workflow.tier, policy.name, workflow.reason)
    else:
        decision = await _decide(state, call, body, policy)
    call.tier, call.reason = decision.tier, decision.reason
    _session(state, call, body, session, decision, policy.tiers())
    # Last of the routing choices (after a session's): the chosen tier must hold the request.
    # A session step still to take (at the reserve) is followed by it there (`_ride`).
    if call.pending is None:
        fit_context_window(state, call, body, policy.tiers())
    if state.drift is not None and call.score is not None:  # the live window, calibration
        state.drift.observe(call.policy, policy, call.score, decision.tier, state.spawn)


async def _decide(state: RouterState, call: Call, body: dict[str, Any], policy: Policy) -> Decision:
    """Score the request (the policy's classifier) and let the policy decide."""
    assert call.identity is not None
    t0 = time.perf_counter()
    scorer = state.scorer_for(call.selection.policy_name if call.selection else None)
    call.score = await state.score_batch.score(scorer, body, state.limits.context_turns)
    state.metrics.classifier_seconds.observe(time.perf_counter() - t0)
    ctx = RoutingContext(
        score=call.score,
        team=call.identity.team,
        budget=await state.budgets.view(call.identity),
        load=state.load(),
        now=time.time(),
        unit=call.id,
    )
    return policy.decide(ctx)


def fit_context_window(
    state: RouterState,
    call: Call,
    body: dict[str, Any],
    candidates: Sequence[str],
    pinned: bool = False,
) -> None:
    """The context-window step (policies/context_window.py): a request the chosen tier cannot
    hold moves to the cheapest of `candidates` that can; a `pinned` tier (the client named it)
    is never moved. None can: one 400 `context_length_exceeded`, before anything is reserved or
    sent upstream. Free when no tier sets a `context_window`."""
    tiers = state.tiers
    if all(t.context_window is None for t in tiers.values()):
        return
    need = _context_need(state, body, call.endpoint)
    call.context_tokens = need.tokens
    chosen = call.tier or ""
    windows = {name: t.context_window for name, t in tiers.items()}
    prices = {name: tiers[name].price for name in candidates if name in tiers}
    tier = fit_tier(chosen, need.tokens, windows, prices, pinned)
    if tier is None:
        considered = [chosen] if pinned else tiers_by_price(prices)
        message = refusal_message(need, windows, considered, named=pinned)
        param = "messages" if "messages" in body else "prompt"
        raise RouterError(400, "context_length_exceeded", message, param=param)
    if tier != chosen:
        call.context_from, call.tier = chosen, tier
        moved = f"{CONTEXT_REASON}: up to {need.tokens} tokens, {chosen} holds {windows[chosen]}"
        call.reason = f"{call.reason}; {moved}; moved to {tier}".lstrip("; ")


def context_fit(
    state: RouterState, body: dict[str, Any], endpoint: str, chosen: str, candidates: Sequence[str]
) -> tuple[str | None, int | None]:
    """Where `fit_context_window` would send the request were `chosen` the routing choice (None:
    nowhere, it would refuse), and the tokens it needs (None: no tier sets a window)."""
    tiers = state.tiers
    if all(t.context_window is None for t in tiers.values()):
        return chosen, None
    need = _context_need(state, body, endpoint)
    windows = {name: t.context_window for name, t in tiers.items()}
    prices = {name: tiers[name].price for name in candidates if name in tiers}
    return fit_tier(chosen, need.tokens, windows, prices), need.tokens


def _context_need(state: RouterState, body: dict[str, Any], endpoint: str) -> ContextNeed:
    settings = state.budgets.settings  # the reservation's estimate and bound: one count
    return context_need(body, endpoint, settings.default_max_tokens, settings.prompt_estimate)


def within_window(chain: list[TierConfig], tokens: int | None) -> list[TierConfig]:
    """The tiers of `chain` whose context window holds `tokens` (None: no window is set)."""
    if tokens is None:
        return chain
    return [t for t in chain if fits(t.context_window, tokens)]


def _session(
    state: RouterState,
    call: Call,
    body: dict[str, Any],
    session: SessionKey | None,
    decision: Decision,
    policy_tiers: list[str],
) -> None:
    """The session mode and the tool loop on the policy's decision (router/proxy/session_step.py):
    what needs no store is noted now; a step the store takes waits for the reserve (`_ride`)."""
    settings = state.selector.session(call.policy)
    got = prepare(session, settings, body, decision, state.tiers, policy_tiers)
    if isinstance(got, PendingStep):
        call.pending = got
    elif got is not None:
        _note_session(state, call, got.mode, got, call.tier or "")


def _note_session(state: RouterState, call: Call, mode: str, info: SessionInfo, tier: str) -> None:
    call.session = info
    state.metrics.session_decisions.labels(call.policy, mode, info.reason).inc()
    if tier != call.tier:
        call.reason = f"{call.reason}; session {info.reason}: {tier}"
        call.tier = tier


async def _ride(
    state: RouterState, call: Call, body: dict[str, Any], sent: dict[str, Any]
) -> StepReserved:
    """The session's step and the request's first reserve, in one store round trip: for each
    tier the step may choose, the chain the request would then take (after the context window,
    which wins over a session's rules) is what it reserves. Then the step's choice is applied
    and the context window checked as `route` does for a request with no step to take."""
    pending, policy = call.pending, call.selection.policy if call.selection else None
    assert pending is not None and policy is not None and call.identity is not None
    candidates = policy.tiers()
    chains: dict[str, list[TierConfig] | None] = {}
    for tier in pending.tiers():
        fitted, tokens = context_fit(state, body, call.endpoint, tier, candidates)
        chains[tier] = None if fitted is None else tier_chain(state, fitted, tokens)
    fail_open = state.budgets.settings.fail_mode == "open"
    done = await state.budgets.ride(
        call.identity,
        sent,
        chains,
        lambda scope, options: step_reserving(
            state.sessions, pending, scope, call.id, options, fail_open
        ),
        endpoint=call.endpoint,
    )
    if done.reservation is not None:  # released by finish() should anything below refuse
        call.hold(done.reservation.amount_nanos)
    tier, info = pending.outcome(done)
    _note_session(state, call, pending.mode, info, tier)
    fit_context_window(state, call, body, candidates)
    return done


def cheaper_tiers(state: RouterState, call: Call) -> list[TierConfig]:
    """Tiers the budget may downgrade to: the policy's own tiers (never for an explicit tier)
    that hold the request (a context window outranks a budget downgrade)."""
    policy = call.selection.policy if call.selection is not None else None
    if policy is None:
        return []
    tiers = [state.tiers[n] for n in policy.tiers() if n != call.tier and n in state.tiers]
    return within_window(tiers, call.context_tokens)


def tier_chain(state: RouterState, first: str, tokens: int | None = None) -> list[TierConfig]:
    """The chosen tier, then its configured fallbacks in order, less the fallbacks whose
    context window cannot hold `tokens` (an upstream 400 is never the plan)."""
    tier = state.tiers[first]
    chain = [tier]
    for name in tier.fallback:
        if name != first and state.tiers[name] not in chain:
            chain.append(state.tiers[name])
    return [tier, *within_window(chain[1:], tokens)]


def upstream_body(body: dict[str, Any], tier: TierConfig, stream: bool) -> dict[str, Any]:
    out = {**body, "model": tier.model}
    if stream:
        # Always ask for usage: budgets are charged from it. The relay strips it again when the
        # client did not ask.
        out["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return out


def upstream_request(
    call: Call, body: dict[str, Any], tier: TierConfig, stream: bool
) -> tuple[str, dict[str, Any]]:
    """(endpoint, body) for `tier`: the chat request, or the client's own request where the
    client API is one the tier speaks (`apis:`, router/apis/base.py). Recorded on the call: the
    answer is read in the shape of what was sent."""
    chat = upstream_body(body, tier, stream)
    native = call.api.upstream(tier, chat, stream) if call.api is not None else None
    if native is None:
        call.upstream_endpoint, call.upstream_request = call.endpoint, None
        return call.endpoint, chat
    call.upstream_endpoint, call.upstream_request = native
    return native


R = TypeVar("R")


class _Fallback(Generic[R]):
    """The one tier-fallback loop: the chain's tiers in order until one answers, each behind
    its in-flight slot (a full tier is skipped). `attempt` runs with the slot held and owns it:
    it gives it back when it fails, and when it answers keeps it for as long as its answer
    needs it. An UpstreamError tries the next tier; anything else ends the request, among them
    an UpstreamClientError: the upstream said the request itself is invalid (a 4xx, or a 5xx
    its server kind answers invalid requests with, backends/normalize.py), and every other tier
    would be sent the same request. Why each tier did not answer becomes one client error."""

    __slots__ = ("state", "call", "body", "saturated", "failed")

    def __init__(self, state: RouterState, call: Call, body: dict[str, Any]) -> None:
        self.state = state
        self.call = call
        self.body = body
        self.saturated: list[str] = []
        self.failed: list[UpstreamError] = []

    async def run(self, chain: list[TierConfig]) -> R:
        call, limiters = self.call, self.state.limiters
        for tier in chain:
            call.tiers_tried.append(tier.name)
            limiter = limiters[tier.name]
            if not await limiter.acquire():
                self.saturated.append(tier.name)
                continue
            call.marks.start("upstream")  # one span over every tier tried
            try:
                return await self.attempt(tier, limiter)
            except UpstreamError as exc:
                self._failure(tier, exc)
        raise self._error()

    async def attempt(self, tier: TierConfig, limiter: TierLimiter) -> R:
        raise NotImplementedError

    def answered(self, tier: TierConfig, deployment: str | None, t0: float, stream: str) -> None:
        """`tier` answered (its first byte, for a stream), `t0` after its slot was taken."""
        state, call = self.state, self.call
        state.metrics.upstream_seconds.labels(tier.name, stream).observe(time.perf_counter() - t0)
        if call.tiers_tried[0] != tier.name:
            state.metrics.fallbacks.labels(call.tiers_tried[0], tier.name).inc()
        call.tier, call.deployment = tier.name, deployment

    def _failure(self, tier: TierConfig, exc: UpstreamError) -> None:
        if isinstance(exc, DeploymentsBusy):  # all its deployments are full: as a full limiter
            self.saturated.append(tier.name)
            return
        log.warning("tier %s failed for %s: %s", tier.name, self.call.id, exc)
        self.failed.append(exc)

    def _error(self) -> RouterError:
        if not self.failed:
            tiers = ", ".join(self.saturated)
            return RouterError(
                429,
                "rate_limited",
                f"all tiers are at capacity ({tiers}); retry",
                headers={"retry-after": "1"},
            )
        # Public phrases only: the upstream's body, exception texts and addresses go to the log
        # (_failure() above) and the trace, never to the client.
        self.call.error_detail = "; ".join(str(e) for e in self.failed)[:2000]
        detail = "; ".join(f"{e.tier}: {e.public}" for e in self.failed)
        if any(e.status is not None for e in self.failed):
            return RouterError(502, "upstream_error", f"upstream failed: {detail}")
        return RouterError(503, "upstream_unavailable", f"no tier could answer: {detail}")


class _Completion(_Fallback[tuple[TierConfig, UpstreamResponse]]):
    """One answer, not streamed: the slot is given back as soon as the upstream answered."""

    __slots__ = ()

    async def attempt(
        self, tier: TierConfig, limiter: TierLimiter
    ) -> tuple[TierConfig, UpstreamResponse]:
        call = self.call
        t0 = time.perf_counter()
        try:
            endpoint, sent = upstream_request(call, self.body, tier, False)
            answer = await self.state.backends[tier.name].complete(endpoint, sent)
        finally:
            limiter.release()
        call.marks.end("upstream")
        self.answered(tier, answer.deployment, t0, "false")
        return tier, answer


def call_tiers(
    state: RouterState, call: Call, body: dict[str, Any], chain: list[TierConfig]
) -> Awaitable[tuple[TierConfig, UpstreamResponse]]:
    """The first tier of `chain` that answers, and its answer (not streamed)."""
    return _Completion(state, call, body).run(chain)


def _answer(
    state: RouterState, call: Call, result: tuple[TierConfig, UpstreamResponse]
) -> Response:
    tier, answer = result
    sent = call.body or {}
    bound = state.budgets.usage_bound(sent, call.endpoint, tier, call.reserved_nanos)
    native = call.upstream_request  # the client's own API was passed through: its shape
    if native is not None and call.upstream_endpoint is not None:
        where = call.upstream_endpoint
        usage = checked_usage(
            answer.usage, bound, lambda: counted_answer_usage(where, native, answer.body)
        )
    else:
        usage = checked_usage(answer.usage, bound, lambda: counted_usage(sent, answer.body))
    body = answer.body
    cost = priced(usage, tier.price, bound)
    if call.api is not None:
        body = call.api.answer(body, usage, cost.cost_usd, native is not None)
    elif not usage.reported:  # the client sees what it is charged for, marked as our count
        body = {**body, "usage": usage_json(usage)}
    model = answer.body.get("model")
    call.charge(
        usage,
        cost,
        model if isinstance(model, str) else tier.model,
        # Shadow comparisons read the upstream's own (chat) answer, not the client API's.
        answer.body if call.api is not None else body,
    )
    finish_once(state, call)
    return json_response(200, body, call.headers())


# --- streaming -----------------------------------------------------------------------------------

# The meter and relay of a stream passed through in a client API's own shape (router/apis/), by
# the endpoint the tier was sent; a chat stream has stream_relay's.
NATIVE_RELAYS: dict[str, tuple[Callable[[dict[str, Any]], Any], Callable[..., Any]]] = {
    "messages": (messages_meter, relay_messages),
    "responses": (responses_meter, relay_responses),
}


async def start_stream(
    state: RouterState, request: Request, call: Call, body: dict[str, Any], chain: list[TierConfig]
) -> Response:
    """Open the first tier that yields a first byte; only then commit to a 200 stream, so a tier
    that fails before answering still falls back. One disconnect watch covers the wait for the
    first byte and then the relay (the response takes it over)."""
    watch = DisconnectWatch(request.receive)
    try:
        return await _Stream(state, call, body, watch).run(chain)
    except BaseException:
        watch.close()
        raise


class _Stream(_Fallback[Response]):
    """A stream: the slot and the upstream connection pass to the response once the first
    byte came (and _client_stream's cleanup gives them back)."""

    __slots__ = ("watch",)

    def __init__(
        self, state: RouterState, call: Call, body: dict[str, Any], watch: DisconnectWatch
    ) -> None:
        super().__init__(state, call, body)
        self.watch = watch

    async def attempt(self, tier: TierConfig, limiter: TierLimiter) -> Response:
        state, call, body = self.state, self.call, self.body
        t0 = time.perf_counter()
        try:
            endpoint, upstream_req = upstream_request(call, body, tier, True)
        except BaseException:
            limiter.release()
            raise
        upstream = state.backends[tier.name].stream(endpoint, upstream_req)
        # Until the response owns the stream (and _client_stream's cleanup), any failure here
        # gives back the tier's slot and the upstream connection; handle() releases the budget.
        try:
            first = await self.watch.guard(_first_bytes(upstream, tier), ClientGone)
        except UpstreamError:
            limiter.release()
            raise
        except BaseException:
            limiter.release()
            await upstream.aclose()
            raise
        try:
            call.ttft_ms = (time.perf_counter() - call.started) * 1000
            # The deployment: only a tier of several deployments names one.
            self.answered(tier, getattr(upstream, "deployment", None), t0, "true")
            native = NATIVE_RELAYS.get(endpoint) if call.upstream_request is not None else None
            # A client API's stream ends with the usage it is charged for: it always gets the
            # usage chunk, to translate.
            want = call.api is not None or bool(
                (body.get("stream_options") or {}).get("include_usage")
            )
            meter: Any = (
                StreamMeter(request=body, want_usage=want) if native is None else native[0](body)
            )
        except BaseException:
            limiter.release()
            await upstream.aclose()
            raise
        parts = _client_stream(
            state,
            call,
            tier,
            upstream,
            first,
            meter,
            limiter.release,
            relay if native is None else native[1],
        )
        if call.api is not None and native is None:  # a chat stream, to translate back
            parts = call.api.stream(parts, call.id)
        return RelayResponse(parts, headers=call.headers(), watch=self.watch)


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
    meter: Any,
    release: Callable[[], None],
    relay_parts: Callable[..., AsyncIterator[tuple[bytes, bool]]] = relay,
) -> AsyncIterator[tuple[bytes, bool]]:
    """`meter` / `relay_parts`: stream_relay's StreamMeter and relay for a chat stream, or a
    client API's own (NATIVE_RELAYS) for one passed through."""
    bound = state.budgets.usage_bound(call.body or {}, call.endpoint, tier, call.reserved_nanos)
    meter.request_id = call.id
    meter.completion_bound = bound.completion_tokens if bound.completion_enforced else None
    meter.guard = lambda usage, own_count: checked_usage(usage, bound, own_count)

    def cost_of(usage: Usage) -> float:
        return priced(usage, tier.price, bound).cost_usd

    finished = False
    try:
        async for part in relay_parts(first, upstream, meter, cost_of):
            finished = part[1]
            yield part
    except BaseException:
        if not finished:  # gone before the end was sent (once it was, the answer is complete)
            call.status, call.error = 499, "client_disconnected"
        raise
    finally:
        release()
        call.marks.end("upstream")  # the stream's end
        if meter.error and call.error is None:
            call.status, call.error = 502, meter.error
        # The charge and the trace first: a cancellation landing in the await below must not
        # skip them.
        usage = meter.final_usage()
        call.charge(
            usage, priced(usage, tier.price, bound), meter.model or tier.model, meter.contents
        )
        call.error_detail = meter.error_detail
        finish_once(state, call)
        await upstream.aclose()  # no-op when finished; otherwise closes the upstream connection


# --- end of a request ----------------------------------------------------------------------------


def finish_once(state: RouterState, call: Call) -> None:
    """Queue finish() once per call. It runs after the response is sent, on the call as it
    stands then: an answer that failed on its way out (after queuing) is settled as a failure."""
    if not call.finishing:
        call.finishing = True
        state.spawn(finish(state, call))


async def finish(state: RouterState, call: Call) -> None:
    """Settle the budget, count metrics, write the trace. Runs after the response is sent."""
    usage = call.usage
    # --- budget: settle ----------------------------------------------------------------------
    call.marks.start("settle")
    if call.reserved:
        if usage is not None and call.cost_usd is not None:
            tokens = usage.prompt_tokens + usage.completion_tokens
            actual = call.cost_usd if call.actual_cost_usd is None else call.actual_cost_usd
            await state.budgets.settle(call.id, actual, tokens)
        else:
            await state.budgets.release(call.id)
    call.marks.end("settle")
    # -----------------------------------------------------------------------------------------
    m = state.metrics
    # As the x-router-tier header: a request refused before any tier was tried (a budget 429)
    # names no tier, though a tier was chosen.
    tier = call.tier if call.tiers_tried else None
    m.requests.labels(tier or "", call.policy, str(call.status)).inc()
    if call.identity is not None and tier:  # per team: its large share, by PromQL
        m.team_requests.labels(call.identity.team, tier).inc()
    if call.error:
        m.errors.labels(call.error).inc()
    if call.api is not None:
        m.api_requests.labels(call.api.name, call.upstream_endpoint or "", str(call.status)).inc()
    if usage is not None and usage.fault is not None:
        m.usage_faults.labels(call.tier or "", usage.fault).inc()
        log.warning(
            "request %s: tier %s reported usage it cannot have used (%s): charged for "
            "the router's own count instead",
            call.id,
            call.tier,
            usage.fault,
        )
    if usage is not None and call.tier:
        m.tokens.labels(call.tier, "prompt").inc(usage.prompt_tokens)
        m.tokens.labels(call.tier, "completion").inc(usage.completion_tokens)
        # Reads for every request, 0 included: the cache-hit ratio's series exist from the
        # first request.
        m.cached_tokens.labels(call.tier, "read").inc(usage.cached_tokens)
        if usage.cache_write_tokens:
            m.cached_tokens.labels(call.tier, "write").inc(usage.cache_write_tokens)
        if usage.reasoning_tokens:
            m.reasoning_tokens.labels(call.tier).inc(usage.reasoning_tokens)
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
    # Vectors, and answers in a client API's own shape (passed through): no chat answer to judge.
    if state.shadow is not None and call.endpoint != "embeddings" and call.upstream_request is None:
        state.shadow.offer(call)  # the answer is handed over; this queues or drops, never waits
    if state.telemetry is not None:
        state.telemetry.record(call, state.tiers.get(call.tier or ""))


async def _fail(state: RouterState, call: Call, status: int, code: str, resp: Response) -> Response:
    call.fail(status, code)
    finish_once(state, call)
    return resp
