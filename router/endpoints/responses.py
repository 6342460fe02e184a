"""`POST /v1/responses`: the OpenAI Responses API (Codex CLI, the Agents SDK), routed as chat.

The request path runs it as the chat request router/apis/responses.py translates it to (scored,
budgeted, traced with `endpoint: responses`), and translates the answer or stream back; a tier
that speaks Responses itself (`apis: [responses]`) is sent the client's own body. Served by the
ASGI front on the hot path (router/server/asgi_front.py) and by this route through the FastAPI
app; both run `serve_responses`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from router.apis.responses import ResponsesApi, ready
from router.apis.responses_schema import ResponsesRequest
from router.http.body_limits import require_json
from router.http.openapi import errors, json_body
from router.proxy.request_path import handle
from router.proxy.state import RouterState

responses_router = APIRouter(tags=["openai"])

RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "a Response object (JSON), or with stream: true an SSE stream of "
        "Responses events (response.created ... response.completed)",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {},
        },
    },
    **errors(400, 401, 404, 408, 413, 415, 429, 502, 503),
}


@responses_router.post(
    "/v1/responses",
    responses=RESPONSES,
    openapi_extra={**json_body(ResponsesRequest), "security": [{"apiKey": []}]},
)
async def responses(request: Request) -> Response:
    require_json(request.scope)  # the ASGI front checks it first on the served path
    return await serve_responses(request.app.state.router, request)


async def serve_responses(state: RouterState, request: Request) -> Response:
    await ready()  # litellm's translation, imported off the event loop the first time
    return await handle(state, request, "chat/completions", api=ResponsesApi())
