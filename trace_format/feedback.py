"""The feedback file: one JSON object per line beside the traces, written by POST /v1/feedback
and read by the A/B report (mean score per request id)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from trace_format.jsonl import read_objects

FEEDBACK_FILE = "feedback.jsonl"


def feedback_path_for(trace_path: str | Path) -> Path:
    """Where feedback for the traces at `trace_path` is kept."""
    return Path(trace_path).parent / FEEDBACK_FILE


def feedback_line(
    request_id: str,
    score: float,
    comment: str | None,
    now: float | None = None,
    *,
    team: str | None = None,
    key_id: str | None = None,
) -> tuple[dict[str, Any], bytes]:
    """One feedback record and its encoded line. `team`/`key_id`: who sent it (the proxy only
    accepts feedback from the team that made the request)."""
    record = {
        "request_id": request_id,
        "score": score,
        "comment": comment,
        "time": time.time() if now is None else now,
        "team": team,
        "key_id": key_id,
    }
    return record, orjson.dumps(record) + b"\n"


def load_feedback(path: str | Path) -> dict[str, float]:
    """Mean feedback score per request id from a feedback file ({} if absent). The file is
    appended to by live replicas (trace_format/jsonl.py); records without a request id and a
    numeric score are skipped."""
    sums: dict[str, list[float]] = {}
    for rec in read_objects(path):
        try:
            rid, score = rec["request_id"], float(rec["score"])
        except (KeyError, TypeError, ValueError):
            continue
        acc = sums.setdefault(rid, [0.0, 0.0])
        acc[0] += score
        acc[1] += 1
    return {rid: total / n for rid, (total, n) in sums.items()}
