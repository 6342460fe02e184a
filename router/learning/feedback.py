"""Feedback storage: a quality signal from `POST /v1/feedback` (router/endpoints/feedback.py) stored
against a trace.

Storage: one JSONL file next to the traces (`feedback.jsonl` beside `requests.jsonl`; the
format is trace_format/feedback.py's), one object per feedback: {request_id, score, comment, time,
team, key_id}. The trace file stays append-only; readers (the A/B report, the simulator, training)
join feedback to traces by id, averaging repeated feedback for one request. Scores are in [0, 1],
like the trace's `outcomes` qualities.

Known ids: the request path calls `FeedbackService.remember(id, team)` for every identified
caller before the response leaves, so feedback right after it never races the asynchronous trace
writer; an id not seen that way (earlier process, restart) is looked up in the trace files
(router/observability/trace_ids.py), whose records name the team. Only the team that made a request
may send feedback on it.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from policies.keys import Identity
from router.observability.trace_ids import TraceIdIndex
from trace_format.feedback import feedback_line, feedback_path_for

# A feedback body is an id, a score and a comment of at most 4000 characters (JSON-escaped, up
# to 6 bytes each): anything larger is not feedback, whatever server.max_body_bytes allows.
FEEDBACK_MAX_BYTES = 64 * 1024


class FeedbackIn(BaseModel):
    """A rating of one of the caller's team's requests."""

    model_config = ConfigDict(extra="forbid", strict=True)
    request_id: str = Field(
        min_length=1,
        max_length=200,
        description="the x-router-request-id header of the rated response",
    )
    score: float = Field(ge=0, le=1, allow_inf_nan=False, description="quality in [0, 1]")
    comment: str | None = Field(default=None, max_length=4000)


class FeedbackService:
    def __init__(
        self, trace_path: str | Path, backups: int, feedback_path: str | Path | None = None
    ) -> None:
        self.index = TraceIdIndex(trace_path, backups)
        self.path = Path(feedback_path) if feedback_path else feedback_path_for(trace_path)
        self._write_lock = threading.Lock()

    def remember(self, request_id: str, team: str | None = None) -> None:
        """A request of `team` with this id exists (its trace may not be on disk yet)."""
        self.index.add(request_id, team)

    async def known(self, request_id: str, caller: Identity | None = None) -> bool:
        """Whether `caller` may send feedback on this id: it exists and (with a caller) was made
        by the caller's team. Another team's id reads as unknown: its existence is not revealed."""
        if request_id not in self.index:
            await asyncio.to_thread(self.index.refresh)
            if request_id not in self.index:
                return False
        return caller is None or self.index.team(request_id) == caller.team

    def _append(self, line: bytes) -> None:
        with self._write_lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as fh:
                fh.write(line)

    async def store(self, fb: FeedbackIn, caller: Identity | None = None) -> dict[str, Any]:
        record, line = feedback_line(
            fb.request_id,
            fb.score,
            fb.comment,
            team=caller.team if caller else None,
            key_id=caller.key_id if caller else None,
        )
        await asyncio.to_thread(self._append, line)
        return record
