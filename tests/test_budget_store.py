"""The BudgetStore contract, run against the in-process store and the real Redis store alike."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from policies.budgets import (
    BudgetExceeded,
    BudgetScope,
    BudgetStore,
    BudgetUnavailable,
    InMemoryBudgetStore,
    spend_from_ledger,
    usd_to_nanos,
)
from policies.redis_budgets import RedisBudgetStore, TeamKeys
from router.config import BudgetLimit, BudgetsConfig
from tests.budget_helpers import REDIS_URL, delete_prefix, free_port, random_prefix

StoreFactory = Callable[..., BudgetStore]


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    prefix = random_prefix()

    def build(lease_s: float = 60.0, timezone: str = "UTC") -> BudgetStore:
        if request.param == "memory":
            return InMemoryBudgetStore(lease_s, timezone)
        # A generous timeout: a loaded CI machine must not turn a slow reply into an outage.
        cfg = BudgetsConfig(store="redis", redis_url=REDIS_URL, key_prefix=prefix,
                            lease_s=lease_s, timezone=timezone, redis_timeout_s=5)
        return RedisBudgetStore(cfg)

    yield build
    delete_prefix(prefix)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def team(limit: float | None, period: str = "daily", **kw: Any) -> BudgetScope:
    return BudgetScope("alpha", None, BudgetLimit(limit_usd=limit, period=period, **kw))


def test_reserve_settle_release_keep_exact_accounts(make_store: StoreFactory) -> None:
    async def main() -> None:
        store = make_store()
        scope = team(1.0)
        await store.reserve(scope, "r1", 0.4, 100)
        await store.reserve(scope, "r2", 0.3, 100)
        st = (await store.status(scope))[0]
        assert (st.spent_nanos, st.reserved_nanos) == (0, usd_to_nanos(0.7))
        settled = await store.settle("r1", 0.123456789, 60)
        assert settled.charged_nanos == 123_456_789 and not settled.duplicate
        await store.release("r2")
        st = (await store.status(scope))[0]
        assert (st.spent_nanos, st.reserved_nanos) == (123_456_789, 0)
        assert st.remaining_nanos == usd_to_nanos(1.0) - 123_456_789
        ledger = await store.ledger("alpha")
        assert [(e.request_id, e.nanos, e.kind) for e in ledger] == [("r1", 123_456_789, "settle")]
        await store.aclose()

    run(main())


def test_reservation_that_does_not_fit_is_refused_with_time_to_reset(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        store = make_store()
        scope = team(1.0)
        await store.reserve(scope, "r1", 0.6, 10)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(scope, "r2", 0.5, 10)
        assert err.value.reason == "budget"
        assert err.value.retry_after_s is not None and 0 < err.value.retry_after_s <= 86400
        await store.reserve(scope, "r3", 0.4, 10)  # exactly fills the limit: allowed
        with pytest.raises(BudgetExceeded):
            await store.reserve(scope, "r4", 0.000000001, 10)
        await store.aclose()

    run(main())


def test_concurrent_reservations_never_exceed_the_limit(make_store: StoreFactory) -> None:
    rng = random.Random(7)
    amounts = [rng.randint(1, 40_000_000) / 1e9 for _ in range(300)]

    async def main() -> None:
        store = make_store()
        scope = team(1.5)

        async def one(i: int) -> int:
            try:
                res = await store.reserve(scope, f"r{i}", amounts[i], 1)
            except BudgetExceeded:
                return 0
            await asyncio.sleep(0)
            actual = res.amount_usd * rng.choice([0.25, 0.5, 1.0])
            return (await store.settle(f"r{i}", actual, 1)).charged_nanos

        charged = await asyncio.gather(*(one(i) for i in range(300)))
        st = (await store.status(scope))[0]
        assert st.spent_nanos == sum(charged) <= usd_to_nanos(1.5)
        assert st.reserved_nanos == 0
        assert sum(e.nanos for e in await store.ledger("alpha")) == st.spent_nanos
        assert spend_from_ledger(await store.ledger("alpha")) == await store.spend("alpha")
        await store.aclose()

    run(main())


def test_settle_is_idempotent_by_request_id(make_store: StoreFactory) -> None:
    async def main() -> None:
        store = make_store()
        scope = team(None)
        await store.reserve(scope, "r1", 0.5, 10)
        first = await store.settle("r1", 0.2, 5)
        again = await store.settle("r1", 0.2, 5)
        assert again.duplicate and again.charged_nanos == first.charged_nanos
        assert (await store.status(scope))[0].spent_nanos == usd_to_nanos(0.2)
        assert len(await store.ledger("alpha")) == 1
        with pytest.raises(ValueError):
            await store.reserve(scope, "r1", 0.5, 10)  # a settled id cannot reserve again
        await store.aclose()

    run(main())


def test_expired_leases_are_reclaimed(make_store: StoreFactory) -> None:
    async def main() -> None:
        dead = make_store(lease_s=0.2)  # a replica that reserves and then dies
        scope = team(1.0)
        await dead.reserve(scope, "lost-1", 0.6, 10)
        await dead.reserve(scope, "lost-2", 0.3, 10)
        with pytest.raises(BudgetExceeded):
            await dead.reserve(scope, "r3", 0.5, 10)
        await asyncio.sleep(0.35)
        if isinstance(dead, RedisBudgetStore):
            live = make_store(lease_s=0.2)
            assert await live.sweep() == 2  # the sweeper finds them without any new request
            await live.reserve(scope, "r3", 0.9, 10)
            await live.aclose()
        else:
            await dead.reserve(scope, "r3", 0.9, 10)  # reclaimed inside reserve itself
        st = (await dead.status(scope))[0]
        assert st.reserved_nanos == usd_to_nanos(0.9) and st.spent_nanos == 0
        await dead.aclose()

    run(main())


def test_team_and_key_limits_are_both_enforced(make_store: StoreFactory) -> None:
    async def main() -> None:
        store = make_store()
        k1 = BudgetScope("alpha", "k1", BudgetLimit(limit_usd=1.0), BudgetLimit(limit_usd=0.3))
        k2 = BudgetScope("alpha", "k2", BudgetLimit(limit_usd=1.0), None)
        await store.reserve(k1, "a", 0.3, 1)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(k1, "b", 0.1, 1)
        assert err.value.scope == "alpha/key:k1"
        await store.reserve(k2, "c", 0.7, 1)  # the team limit still has 0.7
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(k2, "d", 0.1, 1)
        assert err.value.scope == "alpha"
        team_st, key_st = await store.status(k1)
        assert team_st.reserved_nanos == usd_to_nanos(1.0)
        assert key_st.reserved_nanos == usd_to_nanos(0.3)
        await store.aclose()

    run(main())


def test_requests_and_tokens_per_minute(make_store: StoreFactory) -> None:
    async def main() -> None:
        store = make_store()
        scope = team(None, rpm=3, tpm=1000)
        await store.reserve(scope, "a", 0.0, 600)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(scope, "b", 0.0, 500)
        assert err.value.reason == "tpm" and 0 < (err.value.retry_after_s or 0) <= 60
        await store.settle("a", 0.0, 100)  # tpm is corrected to the tokens really used
        await store.reserve(scope, "b", 0.0, 500)
        await store.reserve(scope, "c", 0.0, 100)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(scope, "d", 0.0, 1)
        assert err.value.reason == "rpm"
        await store.aclose()

    run(main())


def test_operator_override_reset_and_ledger(make_store: StoreFactory) -> None:
    async def main() -> None:
        store = make_store()
        scope = team(1.0)
        await store.reserve(scope, "a", 0.5, 1)
        await store.settle("a", 0.5, 1)
        await store.set_limit("alpha", None, BudgetLimit(limit_usd=0.6, period="daily"))
        with pytest.raises(BudgetExceeded):
            await store.reserve(scope, "b", 0.2, 1)
        assert (await store.status(scope))[0].limit_nanos == usd_to_nanos(0.6)
        assert await store.reset("alpha") == usd_to_nanos(0.5)
        await store.reserve(scope, "b", 0.2, 1)
        await store.set_limit("alpha", None, None)  # back to the configured limit
        assert (await store.status(scope))[0].limit_nanos == usd_to_nanos(1.0)
        kinds = [(e.kind, e.nanos) for e in await store.ledger("alpha")]
        assert kinds == [("settle", usd_to_nanos(0.5)), ("reset", -usd_to_nanos(0.5))]
        await store.settle("b", 0.1, 1)
        rebuilt = spend_from_ledger(await store.ledger("alpha"))
        assert rebuilt == await store.spend("alpha") == {
            ("team", (await store.status(scope))[0].period_id): usd_to_nanos(0.1)}
        assert "alpha" in await store.teams()
        await store.aclose()

    run(main())


def test_period_ids_follow_the_configured_zone(make_store: StoreFactory) -> None:
    async def main() -> None:
        store = make_store(timezone="Pacific/Kiritimati")  # UTC+14: already tomorrow
        scope = team(1.0, period="daily")
        res = await store.reserve(scope, "a", 0.1, 1)
        st = (await store.status(scope))[0]
        assert res.periods["team"] == st.period_id
        assert st.resets_at is not None and 0 < st.resets_at - __import__("time").time() <= 86400
        await store.aclose()

    run(main())


def test_redis_scripts_touch_one_cluster_slot_per_team() -> None:
    k = TeamKeys("cr", "team-a")
    names = [k.spend, k.reserved, k.res, k.lease, k.limits, k.ledger, k.rate(1), k.done(1)]
    assert len({key_slot(n.encode()) for n in names}) == 1


def test_unreachable_redis_fails_closed_by_default() -> None:
    cfg = BudgetsConfig(store="redis", redis_url=f"redis://127.0.0.1:{free_port()}/0",
                        key_prefix=random_prefix(), redis_timeout_s=0.2)

    async def main() -> None:
        store = RedisBudgetStore(cfg)
        with pytest.raises(BudgetUnavailable):
            await store.reserve(team(1.0), "a", 0.1, 1)
        assert not await store.ping()
        await store.redis.aclose()

    run(main())


def test_unreachable_redis_fails_open_by_config_and_journals_the_charge(tmp_path: Any) -> None:
    journal = tmp_path / "journal.jsonl"
    cfg = BudgetsConfig(store="redis", redis_url=f"redis://127.0.0.1:{free_port()}/0",
                        key_prefix=random_prefix(), redis_timeout_s=0.2, fail_mode="open",
                        journal_path=str(journal))

    async def main() -> None:
        store = RedisBudgetStore(cfg)
        res = await store.reserve(team(1.0), "a", 0.1, 1)
        assert res.degraded
        out = await store.settle("a", 0.05, 1)
        assert out.deferred and out.charged_nanos == usd_to_nanos(0.05)
        await store.redis.aclose()

        store.journal.close()  # a crash: the non-empty journal stays on disk

    run(main())
    mine = tmp_path / f"journal.jsonl.{os.getpid()}"
    assert '"rid":"a"' in mine.read_text()
    # Another replica (here: a new store, after the file is given a dead pid's name) adopts it.
    mine.rename(tmp_path / "journal.jsonl.1")
    adopter = RedisBudgetStore(cfg)
    assert "a" in adopter.journal.entries
    assert not (tmp_path / "journal.jsonl.1").exists()
    assert '"rid":"a"' in mine.read_text()
    adopter.journal.close()


def test_a_live_replica_keeps_its_leases_while_a_dead_one_loses_them(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        live = make_store(lease_s=0.3)
        dead = make_store(lease_s=0.3)
        await live.start()  # renews every lease_s / 3, as a running proxy does
        await live.reserve(team(1.0), "long-stream", 0.5, 1)
        if isinstance(live, RedisBudgetStore):
            await dead.reserve(team(1.0), "orphan", 0.4, 1)
        await asyncio.sleep(1.0)  # three lease lengths
        statuses = await live.status(team(1.0))
        assert statuses[0].reserved_nanos == usd_to_nanos(0.5)
        assert (await live.settle("long-stream", 0.5, 1)).charged_nanos == usd_to_nanos(0.5)
        await live.aclose()
        await dead.aclose()

    run(main())
