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

from router.http.body_limits import has_body, json_content_type, not_json
from router.http.errors import error_body, error_response, json_response
from router.proxy.request_path import handle

log = logging.getLogger(__name__)

HOT_PATHS = {"/v1/chat/completions": "chat/completions", "/v1/completions": "completions"}
JSON_BODY_PATHS = {*HOT_PATHS, "/v1/feedback"}  # the routes that read a JSON body


class FastPath:
    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if has_body(scope) and scope["path"] in JSON_BODY_PATHS and not json_content_type(scope):
            # Closed: the unread body is not worth reading to keep the connection.
            await error_response(not_json(), {"connection": "close"})(scope, receive, send)
            return
        endpoint = HOT_PATHS.get(scope["path"])
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        try:
            response = await handle(self.app.state.router, Request(scope, receive), endpoint)
        except Exception:  # the request path answers every error it expects; this is a bug
            log.exception("unhandled error on %s", scope["path"])
            body = error_body(500, "internal_error", "internal error in the router")
            response = json_response(500, body)
        await response(scope, receive, send)
