"""Issue 24, finding 1: whatever error the client library raises while talking to Redis, the
store refuses as unavailable (never an error the proxy answers 500 to), journals a settle it
could not apply, and never renews a hold past its request's settle or release.

The failure seen in a cluster failover (redis-py's cluster client closed a node's connections,
those in use by other tasks included, and the proxy's uvloop raised `RuntimeError: unable to
perform operation on <TCPTransport closed=True ...>` on the next write) is reproduced with real
parts: a real Redis or Redis Cluster, the store's real connections, on uvloop as `serve` runs.
The one thing done by hand is what the cluster client did: close those connections' transports
(`close_transports`), the lowest point at which the failure can be made on demand; killing a
master mid-burst makes it too (benchmarks/cluster_failover.py, test_cluster.py), but only in
some runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import uvloop
from redis.asyncio.connection import AbstractConnection

from policies.budgets.factory import build_stores
from policies.budgets.money import usd_to_nanos
from policies.budgets.redis_store import RedisBudgetStore
from policies.budgets.scopes import BudgetScope
from policies.budgets.store import BudgetUnavailable
from policies.config import BudgetLimit, BudgetsConfig
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.redis_cluster import RunningCluster

SCOPE = BudgetScope("alpha", None, BudgetLimit(limit_usd=1.0, period="total"))
KINDS = ["redis", "redis-cluster"]


def run_on_uvloop(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return uvloop.run(main())


def connections(client: Any) -> Iterator[AbstractConnection]:
    """Every connection a redis-py asyncio client holds: a plain client's pool, or each node's
    connections of a cluster client."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        yield from pool._available_connections
        yield from pool._in_use_connections
        return
    for node in client.get_nodes():
        yield from node._connections


def close_transports(store: RedisBudgetStore) -> int:
    """Close the transport under every connection the store has, leaving each connection object
    as it is: what redis-py's cluster client does to connections in use by other tasks when it
    disconnects a node (their next write meets a closed transport). Returns how many."""
    clients = [store.redis, *getattr(store, "_nodes", {}).values()]
    closed = 0
    for client in clients:
        for conn in connections(client):
            writer = getattr(conn, "_writer", None)
            if writer is not None and not writer.transport.is_closing():
                writer.transport.close()
                closed += 1
    return closed


@pytest.fixture(params=KINDS)
def settings(request: pytest.FixtureRequest) -> Iterator[BudgetsConfig]:
    cluster: RunningCluster | None = (
        request.getfixturevalue("redis_cluster") if request.param == "redis-cluster" else None
    )
    prefix = random_prefix()
    yield BudgetsConfig(
        store=request.param,
        redis_url=cluster.url if cluster else REDIS_URL,
        key_prefix=prefix,
        redis_timeout_s=5,
        lease_s=1.5,  # renewed every 0.5 s: a loaded machine must not let a live hold lapse
    )
    if cluster:
        cluster.delete_prefix(prefix)
    else:
        delete_prefix(prefix)


def test_a_transport_closed_under_a_command_is_an_outage_never_an_error(
    settings: BudgetsConfig,
) -> None:
    """Before the fix: reserve raised RuntimeError (the proxy's 500) and settle raised it too,
    leaving the reservation among those the replica renews. Now a reserve succeeds (tried again
    on a fresh connection) or is refused as unavailable, and a settle is applied or journaled;
    no error escapes, every charge told is in the ledger, and nothing is left held."""

    async def main() -> None:
        store, _ = build_stores(settings)
        assert isinstance(store, RedisBudgetStore)
        told: dict[str, int] = {}
        try:
            for i in range(6):
                rid = f"r{i}"
                close_transports(store)
                try:
                    await store.reserve(SCOPE, rid, 0.05, 10)
                except BudgetUnavailable:
                    continue
                close_transports(store)
                told[rid] = (await store.settle(rid, 0.02, 5)).charged_nanos
            assert told, "no request got through"
            assert await store.replay_journal() >= 0
            assert not store.journal.entries
            assert await store.renew() == 0
            ledger = {e.request_id: e.nanos for e in await store.ledger("alpha")}
            assert ledger == told
            status = (await store.status(SCOPE))[0]
            assert status.spent_nanos == sum(told.values()) == len(told) * usd_to_nanos(0.02)
            assert status.reserved_nanos == 0
        finally:
            await store.aclose()

    run_on_uvloop(main)


def test_a_settle_that_fails_stops_renewing_its_hold_which_runs_out_with_its_lease(
    settings: BudgetsConfig,
) -> None:
    """A settle the store answers with an error that is not an outage (here a key of the wrong
    type, as a bug or an operator's mistake would leave it) is raised, and logged by the gate;
    before the fix the reservation also stayed among those the running replica renews, so its
    hold never ran out (77 s with lease_s 6 in the issue). Now it is never renewed again: it is
    reclaimed once its lease runs out, while a live request's hold is still renewed."""

    async def main() -> None:
        store, _ = build_stores(settings)
        assert isinstance(store, RedisBudgetStore)
        raw = redis.asyncio.RedisCluster.from_url if settings.store == "redis-cluster" else None
        direct = raw(settings.redis_url) if raw else redis.asyncio.Redis.from_url(REDIS_URL)
        await store.start()
        try:
            await store.reserve(SCOPE, "broken", 0.25, 10)
            await store.reserve(SCOPE, "live", 0.5, 10)
            # The settle script's first read (its done marker) meets a string: nothing written.
            done = store.keys("alpha").done(store._local["broken"].minute)
            await direct.set(done, "not a hash")
            with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
                await store.settle("broken", 0.1, 5)
            await direct.delete(done)
            deadline = time.monotonic() + 15
            while (await store.status(SCOPE))[0].reserved_nanos != usd_to_nanos(0.5):
                assert time.monotonic() < deadline, "the failed settle's hold is still renewed"
                await asyncio.sleep(0.05)
            # Both were reserved together, so more than a lease has passed for the live one
            # too: it still holds what it reserved because its replica renews it.
            assert (await store.settle("live", 0.5, 5)).charged_nanos == usd_to_nanos(0.5)
        finally:
            await direct.aclose()
            await store.aclose()

    run_on_uvloop(main)


def test_a_journaled_charge_that_cannot_be_applied_holds_up_no_other_and_no_renewal(
    settings: BudgetsConfig, tmp_path: Path
) -> None:
    """A journal adopted from a replica that died owes two charges: one whose team's keys are
    broken (its settle script errors: a bug, not an outage) and one that is fine. Before the fix
    the replay raised on the first, every second, so the second was never applied and the
    maintenance loop never reached the renewals: a live request's hold ran out under it. Now
    the broken charge stays in the journal for an operator, the other is applied, and live
    holds are renewed."""
    minute = int(time.time() // 60)
    base = {"key": "", "overage": 0, "tokens": 5, "periods": {"team": "total"}, "minute": minute}
    owed = [
        {"rid": "broken", "team": "beta", "nanos": usd_to_nanos(0.1), **base},
        {"rid": "fine", "team": "alpha", "nanos": usd_to_nanos(0.2), **base},
    ]
    dead = tmp_path / "journal.jsonl.1"  # a pid no live replica holds: adopted at start
    dead.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in owed))
    settings = settings.model_copy(update={"journal_path": str(tmp_path / "journal.jsonl")})

    async def main() -> None:
        store, _ = build_stores(settings)
        assert isinstance(store, RedisBudgetStore)
        assert set(store.journal.entries) == {"broken", "fine"}
        raw = redis.asyncio.RedisCluster.from_url if settings.store == "redis-cluster" else None
        direct = raw(settings.redis_url) if raw else redis.asyncio.Redis.from_url(REDIS_URL)
        await direct.set(store.keys("beta").done(minute), "not a hash")
        # A replica that stopped (never started, so nothing renews its hold) reserves after
        # the live request: its hold running out shows a whole lease has passed for both.
        gone, _ = build_stores(settings.model_copy(update={"journal_path": None}))
        try:
            await store.reserve(SCOPE, "live", 0.5, 10)
            await gone.reserve(SCOPE, "orphan", 0.25, 10)
            await store.start()
            deadline = time.monotonic() + 15
            while (await store.status(SCOPE))[0].reserved_nanos != usd_to_nanos(0.5):
                assert time.monotonic() < deadline, "a live hold lapsed, or the orphan's never"
                await asyncio.sleep(0.05)
            while "fine" in store.journal.entries:
                assert time.monotonic() < deadline, "the fine charge was never applied"
                await asyncio.sleep(0.05)
            assert set(store.journal.entries) == {"broken"}
            assert [e.request_id for e in await store.ledger("alpha")] == ["fine"]
            # Past a lease, the live request still holds what it reserved: it was renewed.
            status = (await store.status(SCOPE))[0]
            assert status.reserved_nanos == usd_to_nanos(0.5)
            assert status.spent_nanos == usd_to_nanos(0.2)
        finally:
            await direct.delete(store.keys("beta").done(minute))
            await direct.aclose()
            await gone.aclose()
            await store.aclose()

    run_on_uvloop(main)
