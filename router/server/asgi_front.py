"""ASGI front for the two hot endpoints: they skip FastAPI's middleware and routing layers.

Measured on the 2-core dev machine, FastAPI's stack (server-error, telemetry, body-limit,
exception and exit-stack middlewares, router, endpoint wrapper) cost about a fifth of the
proxy's CPU per request. The request path catches every error it expects and answers it
itself, so the only thing the stack added on these routes was the catch-all 500, repeated
here. Every other route (and the OpenAPI docs of these two) is served by the FastAPI app.

Every HTTP request, hot or not, passes the content-type check here first: a body-carrying
request must declare JSON, 415 otherwise (router/http/body_limits.py says why). Slow heads and
bodies are cut below the app, in the server's protocol (router/http/protocol.py).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from router.endpoints.messages import serve_messages
from router.endpoints.responses import serve_responses
from router.http.body_limits import has_body, json_content_type, not_json
from router.http.errors import PATH_ERROR_SHAPES, error_body, error_response, json_response
from router.proxy.request_path import handle

log = logging.getLogger(__name__)

HOT_PATHS = {"/v1/chat/completions": "chat/completions", "/v1/completions": "completions"}
# Client APIs other than OpenAI's (router/apis/): their entry, and their own error shape.
API_PATHS = {"/v1/messages": serve_messages, "/v1/responses": serve_responses}
ERROR_SHAPES = PATH_ERROR_SHAPES
JSON_BODY_PATHS = {*HOT_PATHS, *API_PATHS, "/v1/feedback"}  # the routes that read a JSON body


class FastPath:
    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if has_body(scope) and path in JSON_BODY_PATHS and not json_content_type(scope):
            # Closed: the unread body is not worth reading to keep the connection.
            err = not_json()
            shape = ERROR_SHAPES.get(path)
            response = (
                error_response(err, {"connection": "close"})
                if shape is None
                else json_response(
                    err.status, shape(err.status, err.message), {"connection": "close"}
                )
            )
            await response(scope, receive, send)
            return
        endpoint = HOT_PATHS.get(path)
        api = API_PATHS.get(path)
        shape = ERROR_SHAPES.get(path)
        if shape is not None and scope["method"] != "POST":  # in the API's own error shape
            message = f"{scope['method']} {path}: use POST"
            await json_response(405, shape(405, message), {"allow": "POST"})(scope, receive, send)
            return
        if (endpoint is None and api is None) or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        state = self.app.state.router
        try:
            if api is not None:
                response = await api(state, Request(scope, receive))
            else:
                response = await handle(state, Request(scope, receive), endpoint or "")
        except Exception:  # the request path answers every error it expects; this is a bug
            log.exception("unhandled error on %s", path)
            shape = ERROR_SHAPES.get(path)
            message = "internal error in the router"
            body = (
                error_body(500, "internal_error", message) if shape is None else shape(500, message)
            )
            response = json_response(500, body)
        await response(scope, receive, send)
