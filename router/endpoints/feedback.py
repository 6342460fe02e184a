"""`POST /v1/feedback {request_id, score, comment?}`: the caller rates one of its team's requests.

Same authentication as completions; the body is read with the request path's bounded reader,
under the smaller of `server.max_body_bytes` and FEEDBACK_MAX_BYTES, so an oversized or endless
body is refused with 413 as soon as it passes the limit. Another team's request id gets the same
404 as an unknown one.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from policies.keys import Identity
from router.http.errors import RouterError, error_response, json_response, validation_message
from router.http.openapi import FeedbackOut, errors, json_body, ok
from router.learning.feedback import FEEDBACK_MAX_BYTES, FeedbackIn, FeedbackService
from router.proxy.request_path import identify, parse_body, read_body

feedback_router = APIRouter()


def _service(request: Request) -> FeedbackService | None:
    state = getattr(request.app.state, "router", None)  # the proxy's RouterState
    if state is not None:
        return state.feedback
    return getattr(request.app.state, "feedback", None)  # a bare app (tests, embedding)


@feedback_router.post(
    "/v1/feedback",
    tags=["feedback"],
    responses={**ok(FeedbackOut), **errors(400, 401, 404, 408, 413, 415, 503)},
    openapi_extra={**json_body(FeedbackIn), "security": [{"apiKey": []}]},
)
async def post_feedback(request: Request) -> Response:
    try:
        return await _feedback(request)
    except RouterError as err:  # also for a bare app without the proxy's error handlers
        return error_response(err)


async def _feedback(request: Request) -> Response:
    state = getattr(request.app.state, "router", None)
    caller: Identity | None = None
    limit = FEEDBACK_MAX_BYTES
    if state is not None:
        caller = await identify(state, request)  # 401 for a missing/unknown/revoked key
        limit = min(limit, state.limits.max_body_bytes)
    service = _service(request)
    if service is None:
        raise RouterError(503, "feedback_disabled", "feedback needs traces; traces.path is not set")
    raw = parse_body(await read_body(request, limit))
    if not isinstance(raw, dict):
        raise RouterError(400, "invalid_request", "request body must be a JSON object")
    try:
        fb = FeedbackIn.model_validate(raw)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors(include_url=False)))
        raise RouterError(400, "invalid_feedback", message, param) from None
    if not await service.known(fb.request_id, caller):
        raise RouterError(
            404, "unknown_request_id", f"no traced request with id {fb.request_id!r}", "request_id"
        )
    record = await service.store(fb, caller)
    return json_response(200, {"object": "feedback", **record})
