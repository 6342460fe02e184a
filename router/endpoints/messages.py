"""`POST /v1/messages`: the Anthropic Messages API, routed as the chat request it stands for
(router/apis/messages.py; docs/agents.md).

Served by the ASGI front on the hot path (router/server/asgi_front.py), and by this route through
the FastAPI app; both run `serve_messages`, which runs the request path's one `handle`. The body
is read by the request path itself, as for chat (router/endpoints/openai.py says why); the
published schema names it with `json_body`, and its errors are Anthropic's shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from router.apis.messages import MessagesApi, load_adapter
from router.apis.messages_schema import MessagesRequest
from router.http.openapi import json_body
from router.proxy.request_path import handle
from router.proxy.state import RouterState

messages_router = APIRouter(tags=["anthropic"])

# Anthropic's clients send the key as x-api-key; a bearer token works as for every route.
SECURITY = [{"apiKey": []}, {"anthropicKey": []}]


class AnthropicErrorDetail(BaseModel):
    type: str = Field(description="Anthropic error type, e.g. invalid_request_error")
    message: str = Field(description="one sentence for people")


class AnthropicError(BaseModel):
    """Every error of POST /v1/messages (Anthropic's shape)."""

    type: str = Field(description='"error"')
    error: AnthropicErrorDetail


_DESCRIPTIONS = {
    400: "bad JSON, a body that is not an object, or a field out of range or of the wrong type",
    401: "missing, unknown or revoked API key (x-api-key or Authorization: Bearer)",
    404: "unknown model",
    408: "the body did not arrive in time (server.body_timeout_s)",
    413: "body larger than the limit",
    415: "Content-Type is not application/json",
    429: "budget, rate limit or tier capacity exceeded (Retry-After)",
    502: "the upstream failed",
    503: "the upstream, the budget store or the key store is unavailable",
}

RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "an Anthropic message (JSON), or its SSE events with stream: true "
        "(message_start, content_block_start/delta/stop, message_delta, message_stop)",
        "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
    },
    **{s: {"model": AnthropicError, "description": d} for s, d in _DESCRIPTIONS.items()},
}


async def serve_messages(state: RouterState, request: Request) -> Response:
    api = MessagesApi(await load_adapter())
    return await handle(state, request, "chat/completions", api=api)


@messages_router.post(
    "/v1/messages",
    responses=RESPONSES,
    openapi_extra={
        **json_body(MessagesRequest),
        "security": SECURITY,
        "parameters": [
            {
                "name": "anthropic-version",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "accepted and not required (the router speaks 2023-06-01)",
            }
        ],
    },
)
async def messages(request: Request) -> Response:
    return await serve_messages(request.app.state.router, request)
