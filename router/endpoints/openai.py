"""The OpenAI routes: `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings` and
`GET /v1/models`.

The two completion routes are served by the ASGI front (router/server/asgi_front.py) and reach
these functions only through the FastAPI app (tests, an embedding app); either way they run the
request path's `handle`. Bodies are read and validated by the request path itself (not by FastAPI
parameters) so that oversized bodies, invalid UTF-8 and bad JSON get their own clear errors and
the forwarded body is the client's own dict, validated once; the published schema names each body
with `json_body`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from router.endpoints.embeddings import EmbeddingRequest, embed
from router.http.errors import json_response
from router.http.openapi import ModelList, errors, json_body, ok
from router.http.schemas import ChatCompletionRequest, CompletionRequest
from router.proxy.request_path import handle
from router.proxy.state import RouterState

openai_router = APIRouter(tags=["openai"])

VIRTUAL_MODELS = ("auto",)
AUTH = [{"apiKey": []}]

COMPLETION_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the upstream's answer (JSON), or an SSE stream with stream: true",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {},
        },
    },  # chunks of the upstream, then [DONE]
    **errors(400, 401, 404, 408, 413, 415, 429, 502, 503),
}


@openai_router.post(
    "/v1/chat/completions",
    responses=COMPLETION_RESPONSES,
    openapi_extra={**json_body(ChatCompletionRequest), "security": AUTH},
)
async def chat_completions(request: Request) -> Response:
    return await handle(request.app.state.router, request, "chat/completions")


@openai_router.post(
    "/v1/completions",
    responses=COMPLETION_RESPONSES,
    openapi_extra={**json_body(CompletionRequest), "security": AUTH},
)
async def completions(request: Request) -> Response:
    return await handle(request.app.state.router, request, "completions")


@openai_router.post(
    "/v1/embeddings",
    openapi_extra={**json_body(EmbeddingRequest), "security": AUTH},
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


@openai_router.get("/v1/models", responses=ok(ModelList))
async def models(request: Request) -> Response:
    state: RouterState = request.app.state.router
    return json_response(200, {"object": "list", "data": model_list(state)})


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
