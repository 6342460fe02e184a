"""`POST /v1/feedback {request_id, score, comment?}`: a quality signal stored against a trace.

Storage: one JSONL file next to the traces (`feedback.jsonl` beside `requests.jsonl`), one
object per feedback: {request_id, score, comment, time}. The trace file stays append-only; readers
(the A/B report, the simulator, training) join feedback to traces by id, averaging repeated
feedback for one request. Scores are in [0, 1], like the trace's `outcomes` qualities.

Known ids: the request path calls `FeedbackService.remember(id)` as it writes each trace, so
feedback right after a response never races the asynchronous trace writer; an id not seen that
way (earlier process, restart) is looked up by reading the trace files (current and rotated)
from where the last look-up stopped. Up to `max_ids` ids are kept; the oldest are forgotten first.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from router.errors import error_body, json_response, validation_message

FEEDBACK_FILE = "feedback.jsonl"


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(min_length=1, max_length=200)
    score: float = Field(ge=0, le=1, allow_inf_nan=False)
    comment: str | None = Field(default=None, max_length=4000)


def feedback_path_for(trace_path: str | Path) -> Path:
    return Path(trace_path).parent / FEEDBACK_FILE


class TraceIdIndex:
    """Request ids present in the trace files, read incrementally."""

    def __init__(self, trace_path: str | Path, backups: int, max_ids: int = 2_000_000) -> None:
        self.trace_path = Path(trace_path)
        self.backups = backups
        self.max_ids = max_ids
        self._ids: dict[str, None] = {}
        self._read_upto: dict[tuple[int, int], int] = {}  # (device, inode) -> bytes consumed
        self._lock = threading.Lock()

    def add(self, request_id: str) -> None:
        self._ids[request_id] = None
        if len(self._ids) > self.max_ids:
            # dicts keep insertion order: drop the oldest half in one go.
            for stale in list(self._ids)[: self.max_ids // 2]:
                del self._ids[stale]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._ids

    def _files(self) -> Iterable[Path]:
        # Oldest first, so ids are added in time order.
        for n in range(self.backups, 0, -1):
            yield self.trace_path.with_name(f"{self.trace_path.name}.{n}")
        yield self.trace_path

    def refresh(self) -> None:
        """Read trace lines written since the last refresh (blocking; run it in a thread)."""
        with self._lock:
            for path in self._files():
                self._read_new(path)

    def _read_new(self, path: Path) -> None:
        try:
            fh = path.open("rb")
        except OSError:
            return
        with fh:
            st = os.fstat(fh.fileno())
            key = (st.st_dev, st.st_ino)
            start = self._read_upto.get(key, 0)
            if st.st_size < start:  # truncated: read it again
                start = 0
            fh.seek(start)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next refresh
        for line in data[:end].splitlines():
            try:
                rid = orjson.loads(line).get("id")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            if isinstance(rid, str):
                self.add(rid)
        self._read_upto[key] = start + end


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
        record = {"request_id": fb.request_id, "score": fb.score, "comment": fb.comment,
                  "time": time.time()}
        await asyncio.to_thread(self._append, orjson.dumps(record) + b"\n")
        return record


def load_feedback(path: str | Path) -> dict[str, float]:
    """Mean feedback score per request id from a feedback JSONL file ({} if absent)."""
    sums: dict[str, list[float]] = {}
    p = Path(path)
    if not p.exists():
        return {}
    with p.open("rb") as fh:
        for line in fh:
            try:
                rec = orjson.loads(line)
                rid, score = rec["request_id"], float(rec["score"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
            acc = sums.setdefault(rid, [0.0, 0.0])
            acc[0] += score
            acc[1] += 1
    return {rid: total / n for rid, (total, n) in sums.items()}


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
    from policies.keys import AuthError, KeyStoreUnavailable

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
