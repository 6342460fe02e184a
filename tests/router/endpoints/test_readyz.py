"""`GET /readyz` means "can serve" (docs/deployment.md, "Health checks"): 200 while the budget
store answers and every routing path (a tier a policy may choose, then its fallbacks) has a tier
that answers; the body reports each tier's and each path's state. One tier down behind a fallback
keeps the replica ready, and the request it would have served is served. Real proxy, a real echo
upstream, a port nothing listens on for the tier that is down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai

from benchmarks.echo_upstream import running_echo_upstream
from tests.support.ports import free_port
from tests.support.proxy import ProxyThread, make_config, tier

ALWAYS_LARGE = {"main": {"type": "threshold", "small": "small", "large": "large", "threshold": 0.0}}


def _ask(proxy: ProxyThread) -> Any:
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
    return client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )


def test_one_tier_down_behind_a_fallback_is_still_ready(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens here
    with running_echo_upstream() as up:
        cfg = make_config(
            [
                tier("small", up, price=(1, 1), fallback=["large"]),
                tier("large", down, price=(10, 10), fallback=["small"]),
                tier("spare", down, price=(20, 20)),  # no policy chooses it: only by name
            ],
            tmp_path,
            policies=ALWAYS_LARGE,
            default_policy="main",
        )
        with ProxyThread(cfg) as proxy:
            r = httpx.get(proxy.url + "/readyz", timeout=10)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["ready"] is True
            checks = body["checks"]
            assert checks["tier:small"]["ok"] and checks["budgets"]["ok"]
            assert not checks["tier:large"]["ok"] and not checks["tier:spare"]["ok"]
            assert body["paths"] == {
                "small": {"ok": True, "serving": "small", "tiers": ["small", "large"]},
                "large": {"ok": True, "serving": "small", "tiers": ["large", "small"]},
            }
            # What ready promises: the request the policy sends to the dead tier is served.
            raw = _ask(proxy)
            assert raw.headers["x-router-tier"] == "small"
            assert raw.headers["x-router-fallback-from"] == "large"


def test_a_routing_path_without_a_live_tier_is_not_ready(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"
    with running_echo_upstream() as up:
        cfg = make_config(
            [tier("small", up, price=(1, 1)), tier("large", down, price=(10, 10))],
            tmp_path,
            policies=ALWAYS_LARGE,
            default_policy="main",
        )
        with ProxyThread(cfg) as proxy:
            r = httpx.get(proxy.url + "/readyz", timeout=10)
            assert r.status_code == 503, r.text
            body = r.json()
            assert body["ready"] is False
            assert body["paths"]["large"] == {"ok": False, "serving": None, "tiers": ["large"]}
            assert body["paths"]["small"]["ok"] and body["checks"]["tier:small"]["ok"]
