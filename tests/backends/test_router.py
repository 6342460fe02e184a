"""Signals in the running router: the app's poller feeds load-aware routing, /metrics, traces.

Tier servers are a real HTTP server serving the vLLM fixture as /metrics and fixed chat answers;
the router is the real app (shipped classifier, in-process budgets) driven through its lifespan.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from router.config import config_from_dict
from router.server.app import create_app
from tests.support.metrics_server import LATER, MetricsServer
from tests.support.waiting import wait_for


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    s = MetricsServer()
    yield s
    s.close()


def _config(server: MetricsServer, traces: Path) -> dict:
    root = f"http://127.0.0.1:{server.port}"
    return {
        "tiers": [
            {
                "name": "small",
                "base_url": f"{root}/v1",
                "model": "s",
                "price": {"input_per_mtok": 0.6, "output_per_mtok": 0.6},
            },
            {
                "name": "large",
                "base_url": f"{root}/v1",
                "model": "l",
                "metrics_url": f"{root}/metrics",
                "price": {"input_per_mtok": 10, "output_per_mtok": 30},
            },
        ],
        "default_policy": "shed",
        # threshold 0 sends everything large; margin 1 makes every score borderline, so the
        # large tier's queue alone decides.
        "policies": {
            "shed": {
                "type": "threshold",
                "threshold": 0.0,
                "load_shed": {"max_waiting": 8, "margin": 1.0},
            }
        },
        "budgets": {"store": "memory"},
        "traces": {"path": str(traces)},
        "signals": {"interval_s": 0.05, "timeout_s": 2.0},
    }


def _ask(client: TestClient) -> str:
    body = {"model": "auto", "messages": [{"role": "user", "content": "Summarise this text."}]}
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp.headers["x-router-tier"]


def test_queue_on_large_tier_sheds_to_small_and_is_traced(
    server: MetricsServer, tmp_path: Path
) -> None:
    traces = tmp_path / "requests.jsonl"
    app = create_app(config_from_dict(_config(server, traces)))
    with TestClient(app) as client:
        state = app.state.router
        wait_for(lambda: state.signals.snapshot()["large"].status == "ok", 10, "a first good poll")
        assert _ask(client) == "small"  # fixture: 12 requests waiting on the large server

        metrics = client.get("/metrics").text
        assert 'cost_router_backend_requests_waiting{tier="large"} 12.0' in metrics
        assert 'cost_router_backend_metrics_available{tier="large"} 1.0' in metrics

        server.metrics = LATER  # the queue drained to 1
        wait_for(lambda: state.signals.snapshot()["large"].waiting == 1.0, 10, "the queue reading")
        assert _ask(client) == "large"
        wait_for(
            lambda: client.get("/metrics").text.count("spec_acceptance_rate{") == 1,
            10,
            "the acceptance gauge",
        )

    records = [json.loads(line) for line in traces.read_text().splitlines()]
    shed, kept = records
    assert shed["tier"] == "small" and shed["reason"].startswith("load_shed:")
    assert shed["backend_signals"]["large"]["waiting"] == 12.0
    assert shed["backend_signals"]["large"]["metrics_available"] == 1.0
    assert kept["tier"] == "large" and kept["backend_signals"]["large"]["waiting"] == 1.0
