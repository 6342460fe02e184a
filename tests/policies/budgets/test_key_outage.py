"""Finding 9 of issue 12: a key revoked at run time stays revoked while Redis is down.

A real proxy (subprocess) with `fail_mode: open` and `auth.required`, on a private redis-server
that the test SIGKILLs. Before the fix the replica fell back to "config keys only" during the
outage, so a config key revoked at run time worked again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.echo_upstream import running_echo_upstream
from policies.budgets.factory import build_stores
from policies.config import AuthConfig, BudgetsConfig, KeyConfig
from policies.keys import KeyRing, hash_key
from tests.support.budgets import private_redis, proxies, random_prefix

REVOKED = "sk-conf-revoked"  # in the config file, revoked at run time
UNSEEN = "sk-conf-unseen"  # in the config file, never used before the outage


def _chat(url: str, key: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        timeout=30,
        headers={"authorization": f"Bearer {key}"},
        json={"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    )


def test_a_revoked_key_stays_revoked_while_redis_is_down(tmp_path: Path) -> None:
    prefix = random_prefix()
    keys = [
        {"key_sha256": hash_key(REVOKED), "team": "alpha"},
        {"key_sha256": hash_key(UNSEEN), "team": "alpha"},
    ]
    with private_redis(tmp_path) as server, running_echo_upstream() as upstream:
        budgets: dict[str, Any] = {
            "store": "redis",
            "redis_url": server.url,
            "key_prefix": prefix,
            "fail_mode": "open",
            "key_cache_s": 0,
            "redis_timeout_s": 0.3,
            "journal_path": str(tmp_path / "journal.jsonl"),
        }
        path = tmp_path / "router.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "tiers": [
                        {
                            "name": "small",
                            "base_url": upstream,
                            "model": "echo",
                            "price": {"input_per_mtok": 1, "output_per_mtok": 1},
                        }
                    ],
                    "keys": keys,
                    "auth": {"required": True},
                    "budgets": budgets,
                    "traces": {"path": str(tmp_path / "traces.jsonl")},
                }
            )
        )

        async def admin() -> tuple[str, str]:
            """As `cost-router keys create/revoke` does: a run-time key that stays valid, one
            revoked before the proxy ever saw it, and the config key revoked."""
            store, key_store = build_stores(BudgetsConfig(**budgets))
            ring = KeyRing([KeyConfig(**k) for k in keys], AuthConfig(required=True), key_store)
            try:
                live, _ = await ring.create("beta")
                dead, record = await ring.create("beta")
                await ring.revoke(record.key_id)
                await ring.revoke(hash_key(REVOKED))
                return live, dead
            finally:
                await store.aclose()

        with proxies([path], tmp_path) as (proxy,):
            assert _chat(proxy.url, REVOKED).status_code == 200
            live, dead = asyncio.run(admin())
            assert _chat(proxy.url, REVOKED).json()["error"]["code"] == "revoked_api_key"
            assert _chat(proxy.url, dead).json()["error"]["code"] == "revoked_api_key"
            assert _chat(proxy.url, live).status_code == 200

            server.kill()
            for _ in range(3):
                revoked = _chat(proxy.url, REVOKED)
                assert revoked.status_code == 401, revoked.text  # before the fix: 200
                assert revoked.json()["error"]["code"] == "revoked_api_key"
                assert _chat(proxy.url, dead).status_code == 401
                # Verified against the store just before the outage: fail open admits it.
                assert _chat(proxy.url, live).status_code == 200
                # Never verified by this replica: the store may hold its revocation.
                unseen = _chat(proxy.url, UNSEEN)
                assert unseen.status_code == 503, unseen.text
                assert "error" in unseen.json()
