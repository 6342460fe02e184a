"""Budgets through one real proxy process: auth, downgrade, 429 with Retry-After, /v1/budget,
gauges, run-time keys and limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
import yaml

from benchmarks.echo_upstream import running_echo_upstream
from policies.budgets.factory import build_stores
from policies.config import BudgetLimit
from policies.keys import KeyRing, RedisKeyStore, hash_key
from router.config import load_config
from tests.support.budgets import REDIS_URL, delete_prefix, proxies, random_prefix
from tests.support.ports import free_port

KEY = "sk-test-alpha"
OTHER = "sk-test-beta"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("budget-proxy")
    prefix = random_prefix()
    metrics_port = free_port()
    with running_echo_upstream() as upstream:
        cfg = {
            "tiers": [
                {
                    "name": "small",
                    "base_url": upstream,
                    "model": "echo-small",
                    "price": {"input_per_mtok": 100, "output_per_mtok": 1000},
                },
                {
                    "name": "large",
                    "base_url": upstream,
                    "model": "echo-large",
                    "price": {"input_per_mtok": 1000, "output_per_mtok": 10000},
                },
            ],
            "default_policy": "balanced",
            "policies": {
                "balanced": {
                    "type": "threshold",
                    "threshold": 0.0,
                    "small": "small",
                    "large": "large",
                }
            },
            # large worst case ~ $0.18 (about 100 prompt tokens + 8 output), actual ~ $0.085
            "teams": {
                "alpha": {"budget": {"limit_usd": 0.3, "period": "daily"}},
                "beta": {"budget": {"limit_usd": 100, "period": "monthly"}},
            },
            "keys": [
                {"key_sha256": hash_key(KEY), "team": "alpha", "user": "ann"},
                {"key_sha256": hash_key(OTHER), "team": "beta"},
            ],
            "auth": {"required": True},
            # With keys required, /metrics is not on the API port (docs/monitoring.md).
            "monitoring": {"metrics_listen": f"127.0.0.1:{metrics_port}"},
            "budgets": {
                "store": "redis",
                "redis_url": REDIS_URL,
                "key_prefix": prefix,
                "key_cache_s": 0.2,
                "redis_timeout_s": 5,
            },
            "traces": {"path": str(tmp / "traces.jsonl")},
        }
        path = tmp / "router.yaml"
        path.write_text(yaml.safe_dump(cfg))
        with proxies([path], tmp) as (proxy,):
            yield {
                "url": proxy.url,
                "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics",
                "config": path,
                "traces": tmp / "traces.jsonl",
                "prefix": prefix,
            }
    delete_prefix(prefix)


def chat(url: str, key: str | None, **extra: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    payload = {
        "model": "auto",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hello there"}],
        **extra,
    }
    return httpx.post(url + "/v1/chat/completions", json=payload, headers=headers, timeout=30)


def traces_until(path: Path, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """The trace sink writes in the background: poll until `done` holds (or 10 s)."""
    deadline = time.monotonic() + 10
    records: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_bytes().splitlines()
            records = [orjson.loads(line) for line in lines if line.strip().endswith(b"}")]
            if done(records):
                break
        time.sleep(0.05)
    return records


@pytest.mark.parametrize("key", [None, "sk-unknown"])
def test_missing_or_unknown_key_is_an_openai_401(
    deployment: dict[str, Any], key: str | None
) -> None:
    r = chat(deployment["url"], key)
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["type"] == "authentication_error" and err["code"] in (
        "missing_api_key",
        "invalid_api_key",
    )


def test_downgrade_then_429_with_retry_after_the_daily_reset(deployment: dict[str, Any]) -> None:
    url = deployment["url"]
    first = chat(url, KEY)
    assert first.status_code == 200 and first.headers["x-router-tier"] == "large"
    assert "x-router-downgraded" not in first.headers
    tiers = []
    for _ in range(40):
        r = chat(url, KEY)
        if r.status_code != 200:
            break
        tiers.append((r.headers["x-router-tier"], r.headers.get("x-router-downgraded")))
    assert ("small", "true") in tiers and ("large", "true") not in tiers
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "budget_exceeded"
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    assert abs(int(r.headers["retry-after"]) - (midnight - now).total_seconds()) <= 5

    def refused(records: list[dict[str, Any]]) -> bool:
        return any(t["status"] == 429 and t["error"] == "budget_exceeded" for t in records)

    records = [t for t in traces_until(deployment["traces"], refused) if t.get("team") == "alpha"]
    assert refused(records)
    downgraded = [t for t in records if t["downgraded"]]
    assert downgraded and all(t["tier"] == "small" for t in downgraded)


def test_budget_endpoint_shows_only_the_callers_team(deployment: dict[str, Any]) -> None:
    url = deployment["url"]
    assert chat(url, OTHER).status_code == 200
    r = httpx.get(url + "/v1/budget", headers={"authorization": f"Bearer {OTHER}"})
    assert r.status_code == 200
    data = r.json()
    assert data["team"] == "beta" and data["key_id"] == hash_key(OTHER)[:16]
    team = data["scopes"][0]
    assert team["limit_usd"] == 100 and team["period"] == "monthly" and team["spent_usd"] > 0
    assert data["remaining_usd"] == pytest.approx(100 - team["spent_usd"] - team["reserved_usd"])
    assert httpx.get(url + "/v1/budget").status_code == 401


def test_prometheus_gauges_per_team(deployment: dict[str, Any]) -> None:
    chat(deployment["url"], OTHER)
    text = httpx.get(deployment["metrics_url"]).text
    assert 'cost_router_budget_remaining_usd{scope="team",team="beta"}' in text
    assert 'cost_router_budget_spent_usd{scope="team",team="alpha"}' in text
    assert 'cost_router_budget_limit_usd{scope="team",team="alpha"} 0.3' in text


def test_runtime_keys_and_limits_act_on_the_running_proxy(deployment: dict[str, Any]) -> None:
    cfg = load_config(deployment["config"])

    async def admin() -> tuple[str, str]:
        store, keys = build_stores(cfg.budgets)
        ring = KeyRing(cfg.keys, cfg.auth, keys)
        raw, record = await ring.create("gamma", user="gus")
        await store.set_limit("gamma", None, BudgetLimit(limit_usd=0.0, period="monthly"))
        await store.aclose()
        return raw, record.key_id

    raw, key_id = asyncio.run(admin())
    r = chat(deployment["url"], raw)
    assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded"

    async def lift_and_revoke(revoke: bool) -> None:
        store, keys = build_stores(cfg.budgets)
        await store.set_limit("gamma", None, None if not revoke else BudgetLimit(limit_usd=1))
        if revoke:
            await KeyRing(cfg.keys, cfg.auth, keys).revoke(key_id)
        await store.aclose()

    asyncio.run(lift_and_revoke(False))
    assert chat(deployment["url"], raw).status_code == 200
    asyncio.run(lift_and_revoke(True))
    deadline = time.monotonic() + 10  # the proxy's key cache (key_cache_s) may still admit it
    while (r := chat(deployment["url"], raw)).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.status_code == 401 and r.json()["error"]["code"] == "revoked_api_key"
    client = redis.Redis.from_url(REDIS_URL)
    bucket = RedisKeyStore(client, cfg.budgets.key_prefix).bucket(hash_key(raw))
    assert client.hget(bucket, hash_key(raw)) is not None
    assert raw.encode() not in b"".join(client.hvals(bucket))
    client.close()
