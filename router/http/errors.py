"""OpenAI-style error bodies and the handlers that guarantee a client never sees a stack trace.

Every error leaves the proxy as ``{"error": {"message", "type", "param", "code"}}`` with the HTTP
status an OpenAI client expects, so the official SDKs raise their usual exception classes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

log = logging.getLogger(__name__)

# HTTP status -> OpenAI error `type`.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    499: "client_closed_request",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


class RouterError(Exception):
    """An error the request path turns into an OpenAI-style response."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}


def error_body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# HTTP status -> Anthropic error `type` (POST /v1/messages answers in Anthropic's shape:
# router/apis/messages.py; https://docs.anthropic.com/en/api/errors).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = ANTHROPIC_ERROR_TYPES.get(
        status, "invalid_request_error" if status < 500 else "api_error"
    )
    return {"type": "error", "error": {"type": kind, "message": message}}


# Paths whose errors are not OpenAI's shape, wherever they are answered (the request path, the
# ASGI front, the server's protocol refusing a head): path -> (status, message) -> body.
PATH_ERROR_SHAPES: dict[str, Callable[[int, str], dict[str, Any]]] = {
    "/v1/messages": anthropic_error_body,
}


def error_body_for(path: str, status: int, code: str, message: str) -> dict[str, Any]:
    """The error body a client of `path` expects (OpenAI's unless PATH_ERROR_SHAPES says)."""
    shape = PATH_ERROR_SHAPES.get(path)
    return error_body(status, code, message) if shape is None else shape(status, message)


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def error_response(err: RouterError, extra_headers: dict[str, str] | None = None) -> Response:
    headers = {**err.headers, **(extra_headers or {})}
    body = error_body(err.status, err.code, err.message, err.param)
    return json_response(err.status, body, headers)


def _param_of(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or None


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """First problem of a pydantic error list as (message, param): one clear sentence."""
    if not errors:
        return "invalid request body", None
    first = errors[0]
    param = _param_of(tuple(first.get("loc", ())))
    where = f"'{param}'" if param else "body"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{where}: {first.get('msg', 'invalid value')}{more}", param


async def _router_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RouterError)
    return error_response(exc)


async def _validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    message, param = validation_message(list(exc.errors()))
    return json_response(400, error_body(400, "invalid_request", message, param))


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    detail = exc.detail if isinstance(exc.detail, str) else "request failed"
    return json_response(exc.status_code, error_body(exc.status_code, code, detail), exc.headers)


async def _client_gone(_: Request, exc: Exception) -> Response:
    # The client hung up (or the server cut its slow body) while a route read it: no bug, and
    # nobody to answer.
    return Response(status_code=499)


async def _unexpected(_: Request, exc: Exception) -> Response:
    # Logged with the trace for operators; the client gets a generic message only.
    log.exception("unhandled error in request", exc_info=exc)
    return json_response(500, error_body(500, "internal_error", "internal error in the router"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RouterError, _router_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected)
