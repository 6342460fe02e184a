"""POST /v1/feedback: validation (404 unknown id, 422 bad score), storage, trace look-up."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from router.feedback import FeedbackService
from router.feedback import router as feedback_router
from trace_format.feedback import load_feedback


def _write_trace(path: Path, ids: list[str]) -> None:
    with path.open("ab") as fh:
        for rid in ids:
            fh.write(orjson.dumps({"schema_version": 1, "id": rid, "time": 1.0}) + b"\n")


@pytest.fixture()
def setup(tmp_path: Path):
    trace = tmp_path / "traces" / "requests.jsonl"
    trace.parent.mkdir()
    _write_trace(trace.with_name("requests.jsonl.1"), ["old-1"])
    _write_trace(trace, ["req-1", "req-2"])
    app = FastAPI()
    app.state.feedback = FeedbackService(trace, backups=2)
    app.include_router(feedback_router)
    with TestClient(app) as client:
        yield client, app.state.feedback, trace


def test_feedback_stored_for_traced_ids(setup) -> None:
    client, service, trace = setup
    r = client.post("/v1/feedback", json={"request_id": "req-1", "score": 0.8, "comment": "ok"})
    assert r.status_code == 200, r.text
    assert r.json()["request_id"] == "req-1"
    r = client.post("/v1/feedback", json={"request_id": "req-1", "score": 0.4})
    assert r.status_code == 200
    assert client.post("/v1/feedback", json={"request_id": "old-1", "score": 1}).status_code == 200
    assert service.path == trace.parent / "feedback.jsonl"
    assert load_feedback(service.path) == {"req-1": pytest.approx(0.6), "old-1": 1.0}


def test_ids_written_later_and_remembered_ids_are_found(setup) -> None:
    client, service, trace = setup
    assert client.post("/v1/feedback", json={"request_id": "late", "score": 0.5}).status_code == 404
    _write_trace(trace, ["late"])  # the trace writer caught up
    assert client.post("/v1/feedback", json={"request_id": "late", "score": 0.5}).status_code == 200
    service.remember("in-flight")  # the request path registers ids before the trace is on disk
    r = client.post("/v1/feedback", json={"request_id": "in-flight", "score": 0.0})
    assert r.status_code == 200


def test_unknown_id_is_404_openai_style(setup) -> None:
    client, _, _ = setup
    r = client.post("/v1/feedback", json={"request_id": "nope", "score": 0.5})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "unknown_request_id" and err["param"] == "request_id"
    assert err["type"] == "not_found_error" and "nope" in err["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"request_id": "req-1", "score": 1.5}, "score"),
        ({"request_id": "req-1", "score": -0.1}, "score"),
        ({"request_id": "req-1", "score": "good"}, "score"),
        ({"request_id": "req-1"}, "score"),
        ({"score": 0.5}, "request_id"),
        ({"request_id": "req-1", "score": 0.5, "rating": 3}, "rating"),
    ],
)
def test_bad_feedback_is_422(setup, body: dict, param: str) -> None:
    client, service, _ = setup
    r = client.post("/v1/feedback", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert not service.path.exists()


def test_non_json_is_400(setup) -> None:
    client, _, _ = setup
    r = client.post("/v1/feedback", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
