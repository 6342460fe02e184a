"""FastAPI factory: ``create_app(config)`` -> the OpenAI-compatible routing proxy.

Composes the app: the state's lifecycle (built by router/proxy/build.py), the config reloader,
the routes of router/endpoints/, the error handlers and the published schema. Routes read
``request.app.state.router`` (a RouterState) once per request; ``swap_state`` replaces it
atomically for hot reload.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from router.apis.messages_schema import MessagesRequest
from router.apis.responses_schema import ResponsesRequest
from router.config import RouterConfig
from router.endpoints.admin import BODIES as ADMIN_BODIES
from router.endpoints.admin import admin_router
from router.endpoints.budget import budget_router
from router.endpoints.embeddings import EmbeddingRequest
from router.endpoints.feedback import feedback_router
from router.endpoints.messages import messages_router
from router.endpoints.openai import openai_router
from router.endpoints.ops import ops_router
from router.endpoints.responses import responses_router
from router.http.errors import install_error_handlers
from router.http.not_found import not_found_router
from router.http.openapi import install_openapi
from router.http.schemas import ChatCompletionRequest, CompletionRequest
from router.learning.feedback import FeedbackIn
from router.proxy.build import (
    Routing,
    build_routing,
    build_state,
    reload_state,
    start_state,
    stop_state,
)
from router.proxy.reload import ConfigReloader
from router.proxy.state import RouterState


def swap_state(app: FastAPI, new: RouterState) -> RouterState:
    """Install a new state for subsequent requests; returns the old one (caller closes it
    once its in-flight requests are done)."""
    old: RouterState = app.state.router
    app.state.router = new
    return old


def apply_routing(app: FastAPI, routing: Routing, config: RouterConfig) -> None:
    """Hot reload of routing (router/proxy/reload.py's `apply`): the running state with the new
    routing (router/proxy/build.py `reload_state`)."""
    swap_state(app, reload_state(app.state.router, routing, config))


def create_app(
    config: RouterConfig, config_path: str | Path | None = None, **state_kwargs: Any
) -> FastAPI:
    """state_kwargs go to build_state (e.g. preloaded scorers or a shared budget store).
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
    app.include_router(budget_router)
    app.include_router(feedback_router)
    app.include_router(admin_router)  # /admin/v1/...: keys, teams, budgets (admin keys only)
    app.include_router(openai_router)
    app.include_router(messages_router)  # POST /v1/messages (Anthropic), router/apis/messages.py
    app.include_router(responses_router)  # POST /v1/responses (router/apis/responses.py)
    app.include_router(ops_router)
    app.include_router(not_found_router)  # last: what no route above serves gets the listing
    install_openapi(
        app,
        [
            ChatCompletionRequest,
            CompletionRequest,
            MessagesRequest,
            ResponsesRequest,
            FeedbackIn,
            EmbeddingRequest,
            *ADMIN_BODIES,
        ],
    )
    return app


def _start_reloader(app: FastAPI, config_path: str | Path | None) -> ConfigReloader | None:
    if config_path is None:
        return None
    reloader = ConfigReloader(
        config_path,
        current=lambda: app.state.router.config,
        apply=lambda routing, config: apply_routing(app, routing, config),
        build=lambda config: build_routing(config, app.state.router.scorers),
        debounce_s=app.state.router.config.server.reload_debounce_s,
    )
    reloader.start()
    return reloader
