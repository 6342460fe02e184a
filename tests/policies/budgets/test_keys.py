"""API keys: hashing, config and run-time keys, revocation. The keys/budget commands are tested in
tests/router/commands/test_budget_cli.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from policies.config import AuthConfig, KeyConfig
from policies.keys import (
    AuthError,
    Identity,
    InMemoryKeyStore,
    KeyRing,
    KeyStore,
    RedisKeyStore,
    hash_key,
)
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix


def ring_of(
    store: KeyStore,
    required: bool,
    keys: list[dict[str, Any]] | None = None,
    cache_s: float = 5.0,
    **auth: Any,
) -> KeyRing:
    return KeyRing(
        [KeyConfig(**k) for k in keys or []], AuthConfig(required=required, **auth), store, cache_s
    )


@pytest.fixture
def prefix() -> Iterator[str]:
    p = random_prefix()
    yield p
    delete_prefix(p)


def test_keys_are_stored_only_as_hashes_and_map_to_identity() -> None:
    ring = ring_of(
        InMemoryKeyStore(),
        True,
        [{"key_sha256": hash_key("sk-alpha"), "team": "alpha", "user": "ann"}],
    )

    async def main() -> None:
        ident = await ring.authenticate("Bearer sk-alpha")
        assert ident == Identity("alpha", hash_key("sk-alpha")[:16], "ann")
        raw, record = await ring.create("beta", name="ci")
        assert raw not in record.to_json().decode() and record.key_sha256 == hash_key(raw)
        assert (await ring.authenticate(f"bearer {raw}")).team == "beta"

    asyncio.run(main())


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic abc", "Bearer sk-unknown"])
def test_missing_or_unknown_key_is_401_when_auth_required(header: str | None) -> None:
    ring = ring_of(InMemoryKeyStore(), True)
    with pytest.raises(AuthError):
        asyncio.run(ring.authenticate(header))


def test_without_required_auth_unknown_callers_use_the_default_team() -> None:
    ring = ring_of(InMemoryKeyStore(), False, default_team="public")
    assert asyncio.run(ring.authenticate(None)) == Identity("public")
    assert asyncio.run(ring.authenticate("Bearer whatever")) == Identity("public")


def test_revocation_reaches_every_replica_through_redis(prefix: str) -> None:
    keys = [{"key_sha256": hash_key("sk-conf"), "team": "alpha"}]

    async def main() -> None:
        clients = [redis.asyncio.Redis.from_url(REDIS_URL) for _ in range(2)]
        admin = ring_of(RedisKeyStore(clients[0], prefix), True, keys, cache_s=0)
        replica = ring_of(RedisKeyStore(clients[1], prefix), True, keys, cache_s=0)
        raw, record = await admin.create("beta", user="bob")
        assert await replica.authenticate(f"Bearer {raw}") == Identity("beta", record.key_id, "bob")
        await admin.revoke(record.key_id)
        with pytest.raises(AuthError, match="revoked"):
            await replica.authenticate(f"Bearer {raw}")
        # A key from the config file can be revoked at run time too.
        await admin.revoke(hash_key("sk-conf")[:12])
        with pytest.raises(AuthError):
            await replica.authenticate("Bearer sk-conf")
        listed = {r.key_id: r for r in await replica.list()}
        assert listed[record.key_id].revoked and listed[hash_key("sk-conf")[:16]].revoked
        for c in clients:
            await c.aclose()

    asyncio.run(main())
