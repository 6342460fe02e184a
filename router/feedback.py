"""`POST /v1/feedback {request_id, score, comment?}`: a quality signal stored against a trace.

Storage: one JSONL file next to the traces (`feedback.jsonl` beside `requests.jsonl`; the
format is trace_format/feedback.py's), one object per feedback: {request_id, score, comment, time}.
The trace file stays append-only; readers (the A/B report, the simulator, training) join
feedback to traces by id, averaging repeated feedback for one request. Scores are in [0, 1], like
the trace's `outcomes` qualities.

Known ids: the request path calls `FeedbackService.remember(id)` as it writes each trace, so
feedback right after a response never races the asynchronous trace writer; an id not seen that
way (earlier process, restart) is looked up in the trace files (router/trace_ids.py).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from policies.keys import AuthError, KeyStoreUnavailable
from router.errors import error_body, json_response, validation_message
from router.trace_ids import TraceIdIndex
from trace_format.feedback import feedback_line, feedback_path_for


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(min_length=1, max_length=200)
    score: float = Field(ge=0, le=1, allow_inf_nan=False)
    comment: str | None = Field(default=None, max_length=4000)


class FeedbackService:
    def __init__(self, trace_path: str | Path, backups: int,
                 feedback_path: str | Path | None = None) -> None:
        self.index = TraceIdIndex(trace_path, backups)
        self.path = Path(feedback_path) if feedback_path else feedback_path_for(trace_path)
        self._write_lock = threading.Lock()

    def remember(self, request_id: str) -> None:
        self.index.add(request_id)

    async def known(self, request_id: str) -> bool:
        if request_id in self.index:
            return True
        await asyncio.to_thread(self.index.refresh)
        return request_id in self.index

    def _append(self, line: bytes) -> None:
        with self._write_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as fh:
                fh.write(line)

    async def store(self, fb: FeedbackIn) -> dict[str, Any]:
        record, line = feedback_line(fb.request_id, fb.score, fb.comment)
        await asyncio.to_thread(self._append, line)
        return record


def _error(status: int, code: str, message: str, param: str | None = None) -> Response:
    return json_response(status, error_body(status, code, message, param))


router = APIRouter()


def _service(request: Request) -> FeedbackService | None:
    state = getattr(request.app.state, "router", None)  # the proxy's RouterState
    if state is not None:
        return state.feedback
    return getattr(request.app.state, "feedback", None)  # a bare app (tests, embedding)


async def _auth_error(request: Request) -> Response | None:
    """Same authentication as completions when the proxy requires keys."""
    state = getattr(request.app.state, "router", None)
    if state is None:
        return None
    try:
        await state.keys.authenticate(request.headers.get("authorization"))
    except AuthError as exc:
        return _error(401, exc.code, str(exc))
    except KeyStoreUnavailable as exc:
        return _error(503, "key_store_unavailable", str(exc))
    return None


@router.post("/v1/feedback")
async def post_feedback(request: Request) -> Response:
    denied = await _auth_error(request)
    if denied is not None:
        return denied
    service = _service(request)
    if service is None:
        return _error(503, "feedback_disabled", "feedback needs traces; traces.path is not set")
    try:
        raw = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return _error(400, "invalid_json", "request body is not valid JSON")
    if not isinstance(raw, dict):
        return _error(400, "invalid_request", "request body must be a JSON object")
    try:
        fb = FeedbackIn.model_validate(raw)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()))
        return _error(422, "invalid_feedback", message, param)
    if not await service.known(fb.request_id):
        return _error(404, "unknown_request_id",
                      f"no traced request with id {fb.request_id!r}", "request_id")
    record = await service.store(fb)
    return json_response(200, {"object": "feedback", **record})
