"""FastAPI factory: ``create_app(config)`` -> the OpenAI-compatible routing proxy.

Routes read ``request.app.state.router`` (a RouterState) once per request; ``swap_state`` replaces
it atomically for hot reload. Bodies are read and validated by the request path itself (not by
FastAPI parameters) so that oversized bodies, invalid UTF-8 and bad JSON get their own clear
errors and the forwarded body is the client's own dict, validated once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from backends.registry import build_backends, close_backends
from backends.signal_deployments import register_deployments
from backends.signal_poller import SignalsPoller
from backends.signals_metrics import register_signals
from policies.budgets.factory import build_stores
from policies.budgets.metrics import BudgetGauges
from policies.budgets.store import BudgetStore
from policies.calibration import calibration_store, carry_calibration
from policies.keys import KeyRing, KeyStore
from router.config import RouterConfig
from router.endpoints.admin import BODIES as ADMIN_BODIES
from router.endpoints.admin import admin_router
from router.endpoints.budget import budget_router
from router.endpoints.embeddings import EmbeddingRequest, embed
from router.endpoints.feedback import feedback_router
from router.http.errors import install_error_handlers, json_response
from router.http.not_found import not_found_router
from router.http.openapi import Health, ModelList, Readiness, errors, install_openapi, json_body, ok
from router.http.schemas import ChatCompletionRequest, CompletionRequest
from router.learning.feedback import FeedbackIn, FeedbackService
from router.learning.shadow import build_shadow, reload_shadow
from router.observability.drift_monitor import DriftMonitor
from router.observability.metrics import RouterMetrics
from router.observability.telemetry_config import CallTracer
from router.observability.trace_sink import TraceSink
from router.proxy.budget_gate import BudgetGate
from router.proxy.reload import ConfigReloader
from router.proxy.request_path import handle
from router.proxy.state import (
    RouterState,
    Routing,
    Scorer,
    Scorers,
    TierLimiter,
    build_routing,
    build_selector,
    load_scorers,
)
from trace_format.config_base import ConfigError

log = logging.getLogger(__name__)

VIRTUAL_MODELS = ("auto",)


def load_scorer(config: RouterConfig) -> Scorers:
    """Every classifier model the config names (raises ModelLoadError naming the key)."""
    return load_scorers(config)


def key_ring(config: RouterConfig, store: KeyStore, previous: KeyRing | None = None) -> KeyRing:
    ring = KeyRing(
        config.keys,
        config.auth,
        store,
        config.budgets.key_cache_s,
        config.budgets.key_outage_grace_s,
    )
    if previous is not None:
        ring.adopt(previous)  # a reload must not forget the revocations this replica has seen
    return ring


def budget_gate(
    config: RouterConfig, store: BudgetStore, gauges: BudgetGauges | None
) -> BudgetGate:
    return BudgetGate(store, config.budgets, config.teams, config.keys, config.tiers, gauges)


def build_state(
    config: RouterConfig,
    *,
    scorer: Scorer | Scorers | None = None,
    metrics: RouterMetrics | None = None,
    budget_store: BudgetStore | None = None,
    key_store: KeyStore | None = None,
) -> RouterState:
    metrics = metrics or RouterMetrics()
    if budget_store is None or key_store is None:
        built_budgets, built_keys = build_stores(config.budgets)
        budget_store, key_store = budget_store or built_budgets, key_store or built_keys
    traces = feedback = None
    if config.traces.path:
        traces = TraceSink(config.traces.path, config.traces.max_bytes, config.traces.backups)
        feedback = FeedbackService(config.traces.path, config.traces.backups)
    backends = build_backends(config.tiers)
    register_deployments(backends, metrics.registry)  # tiers' deployments in /metrics
    return RouterState(
        config=config,
        selector=build_selector(config),
        scorers=scorer if isinstance(scorer, Scorers) else load_scorers(config, default=scorer),
        backends=backends,
        limiters={
            t.name: TierLimiter(t.name, t.max_inflight, t.queue_timeout_s, metrics)
            for t in config.tiers
        },
        keys=key_ring(config, key_store),
        budgets=budget_gate(config, budget_store, BudgetGauges(metrics.registry)),
        metrics=metrics,
        traces=traces,
        feedback=feedback,
        signals=_signals(config, metrics),
        telemetry=_telemetry(config),
        drift=DriftMonitor(
            config.monitoring,
            metrics,
            calibration_store(budget_store, config.budgets.key_prefix),
            config.classifier.model_path,
            config.traces.path,
        ),
        shadow=build_shadow(
            config.evaluation,
            config.traces.path,
            {t.name: t for t in config.tiers},
            backends,
            budget_store,
            metrics.registry,
            config.budgets,
            config.classifier.context_turns,
        ),
    )


def _telemetry(config: RouterConfig) -> CallTracer | None:
    if not config.telemetry.enabled:
        return None
    # Imported only when tracing is on: OpenTelemetry is the optional `otel` extra, and a proxy
    # with tracing off must not load it.
    try:
        from router.observability.telemetry import Telemetry
    except ImportError as exc:
        raise ConfigError(
            f"telemetry.enabled needs OpenTelemetry ({exc.name} is missing): "
            "pip install 'cost-router[otel]'"
        ) from None
    return Telemetry(config.telemetry)


def _signals(config: RouterConfig, metrics: RouterMetrics) -> SignalsPoller | None:
    if not config.signals.enabled:
        return None
    # Polled: tiers with a metrics_url or a launch profile (see backends.signal_endpoints).
    poller = SignalsPoller.for_tiers(config.tiers, config.signals)
    if not poller.endpoints:
        return None
    register_signals(poller, metrics.registry)  # per-tier gauges in the router's /metrics
    return poller


async def start_state(state: RouterState) -> None:
    await state.budgets.store.start()
    if state.drift is not None:
        await state.drift.load(state.selector.policies)  # calibrated thresholds, before traffic
    if state.signals is not None:
        state.signals.start()
    if state.shadow is not None:
        state.shadow.start()
    # Everything loaded so far (libraries, classifier, config) lives for the whole process;
    # freezing it keeps the collector from rescanning it, which otherwise shows up as
    # tens-of-milliseconds pauses in the p99 latency.
    gc.collect()
    gc.freeze()


async def stop_state(state: RouterState) -> None:
    """After the server stopped taking requests: finish settles/traces, then close everything."""
    await state.drain()
    if state.shadow is not None:
        await state.shadow.stop()  # before the backends and the store it uses close
    if state.signals is not None:
        await state.signals.stop()
    await close_backends(state.backends)
    await state.budgets.store.aclose()
    if state.traces is not None:
        state.traces.close()
    if state.telemetry is not None:
        await asyncio.to_thread(state.telemetry.shutdown)  # flushes spans: network, off the loop


def swap_state(app: FastAPI, new: RouterState) -> RouterState:
    """Install a new state for subsequent requests; returns the old one (caller closes it
    once its in-flight requests are done)."""
    old: RouterState = app.state.router
    app.state.router = new
    return old


def apply_routing(app: FastAPI, routing: Routing, config: RouterConfig) -> None:
    """Hot reload of routing (router/proxy/reload.py's `apply`): same backends, limiters and stores,
    new policies/experiments/teams/keys and classifier models (loaded by build_routing, off the
    event loop). In-flight requests keep the state, and so the models, they started with."""
    old: RouterState = app.state.router
    carry_calibration(old.selector.policies, routing.selector.policies)
    swap_state(
        app,
        replace(
            old,
            config=config,
            selector=routing.selector,
            scorers=routing.scorers,
            keys=key_ring(config, old.keys.store, old.keys),
            budgets=budget_gate(config, old.budgets.store, old.budgets.gauges),
            pending=old.pending,
            # The evaluation section reloads: the running shadow service reconfigured in place.
            shadow=reload_shadow(
                old.shadow,
                config.evaluation,
                config.traces.path,
                {t.name: t for t in config.tiers},
                old.backends,
                old.budgets.store,
                old.metrics.registry,
                config.budgets,
                config.classifier.context_turns,
            ),
        ),
    )


def create_app(
    config: RouterConfig, config_path: str | Path | None = None, **state_kwargs: Any
) -> FastAPI:
    """state_kwargs go to build_state (e.g. a preloaded scorer or a shared budget store).
    config_path: the file `config` came from; its routing part hot-reloads on change or SIGHUP."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = build_state(config, **state_kwargs)
        app.state.router = state
        await start_state(state)
        reloader = app.state.reloader = _start_reloader(app, config_path)
        try:
            yield
        finally:
            if reloader is not None:
                await reloader.stop()
            await stop_state(app.state.router)

    app = FastAPI(title="cost-router", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    _add_routes(app)
    app.include_router(not_found_router)  # last: what no route above serves gets the listing
    install_openapi(
        app, [ChatCompletionRequest, CompletionRequest, FeedbackIn, EmbeddingRequest, *ADMIN_BODIES]
    )
    return app


def _start_reloader(app: FastAPI, config_path: str | Path | None) -> ConfigReloader | None:
    if config_path is None:
        return None
    reloader = ConfigReloader(
        config_path,
        current=lambda: app.state.router.config,
        apply=lambda routing, cfg: apply_routing(app, routing, cfg),
        build=lambda cfg: build_routing(cfg, app.state.router.scorers),
        debounce_s=app.state.router.config.server.reload_debounce_s,
    )
    reloader.start()
    return reloader


def _add_routes(app: FastAPI) -> None:
    app.include_router(budget_router)
    app.include_router(feedback_router)
    app.include_router(admin_router)  # /admin/v1/...: keys, teams, budgets (admin keys only)

    # The published schema (router/http/openapi.py): bodies these routes read themselves, and
    # errors.
    completion_responses = {
        200: {
            "description": "the upstream's answer (JSON), or an SSE stream with stream: true",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {},
            },
        },  # chunks of the upstream, then [DONE]
        **errors(400, 401, 404, 408, 413, 415, 429, 502, 503),
    }
    auth = [{"apiKey": []}]

    @app.post(
        "/v1/chat/completions",
        tags=["openai"],
        responses=completion_responses,
        openapi_extra={**json_body(ChatCompletionRequest), "security": auth},
    )
    async def chat_completions(request: Request) -> Response:
        return await handle(request.app.state.router, request, "chat/completions")

    @app.post(
        "/v1/completions",
        tags=["openai"],
        responses=completion_responses,
        openapi_extra={**json_body(CompletionRequest), "security": auth},
    )
    async def completions(request: Request) -> Response:
        return await handle(request.app.state.router, request, "completions")

    @app.post(
        "/v1/embeddings",
        tags=["openai"],
        openapi_extra={**json_body(EmbeddingRequest), "security": auth},
        responses={
            200: {
                "description": "the upstream's embeddings (JSON)",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            **errors(400, 401, 404, 408, 413, 415, 429, 502, 503),
        },
    )
    async def embeddings(request: Request) -> Response:
        # Unrouted: the tier embeddings.tier names (router/endpoints/embeddings.py).
        return await handle(request.app.state.router, request, "embeddings", embed)

    @app.get("/v1/models", tags=["openai"], responses=ok(ModelList))
    async def models(request: Request) -> Response:
        state: RouterState = request.app.state.router
        return json_response(200, {"object": "list", "data": model_list(state)})

    @app.get("/healthz", tags=["ops"], responses=ok(Health))
    async def healthz() -> Response:
        return json_response(200, {"status": "ok"})

    @app.get(
        "/readyz",
        tags=["ops"],
        responses={**ok(Readiness), 503: {"model": Readiness, "description": "not ready"}},
    )
    async def readyz(request: Request) -> Response:
        state: RouterState = request.app.state.router
        checks = await readiness(state)
        ok = all(c["ok"] for c in checks.values())
        return json_response(200 if ok else 503, {"ready": ok, "checks": checks})

    @app.get("/metrics", tags=["ops"], responses=ok(media_type="text/plain"))
    async def metrics(request: Request) -> Response:
        await request.app.state.router.budgets.refresh_gauges()
        state: RouterState = request.app.state.router
        if state.drift is not None:
            await state.drift.refresh(state.selector.policies, state.config.policies)
        body, content_type = request.app.state.router.metrics.render()
        return Response(body, media_type=content_type)


def model_list(state: RouterState) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for name in (*VIRTUAL_MODELS, *(f"router:{p}" for p in state.selector.policies)):
        entries.append({"id": name, "object": "model", "owned_by": "cost-router"})
    for tier in state.config.tiers:
        entries.append(
            {
                "id": tier.name,
                "object": "model",
                "owned_by": "cost-router",
                "upstream_model": tier.model,
            }
        )
    return entries


async def readiness(state: RouterState) -> dict[str, dict[str, Any]]:
    names = list(state.backends)
    results = await asyncio.gather(*(state.backends[n].ready() for n in names))
    checks = {
        f"tier:{n}": {"ok": ok, "detail": detail}
        for n, (ok, detail) in zip(names, results, strict=True)
    }
    try:
        store_ok = await state.budgets.store.ping()
        checks["budgets"] = {"ok": store_ok, "detail": state.budgets.store.kind}
    except Exception as exc:  # noqa: BLE001 - a readiness probe reports, never raises
        checks["budgets"] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
    return checks
