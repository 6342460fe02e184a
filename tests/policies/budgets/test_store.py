"""What one store kind does beyond the shared contract (that is test_store_conformance.py):
Redis key layout and outages, background lease renewal, the in-process store's memory of settles.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from redis.crc import key_slot

from policies.budgets.codec import TeamKeys, decode_limit, encode_limit, team_of_key
from policies.budgets.journal import Journal
from policies.budgets.memory import InMemoryBudgetStore
from policies.budgets.money import usd_to_nanos
from policies.budgets.redis_store import RedisBudgetStore
from policies.budgets.scopes import BudgetScope
from policies.budgets.store import DONE_TTL_S, BudgetUnavailable
from policies.config import BudgetLimit, BudgetsConfig
from tests.support.budgets import REDIS_URL, ManualClock, delete_prefix, random_prefix
from tests.support.ports import free_port
from tests.support.waiting import wait_for


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def team(limit: float | None, period: str = "daily", **kw: Any) -> BudgetScope:
    return BudgetScope("alpha", None, BudgetLimit(limit_usd=limit, period=period, **kw))


def test_redis_scripts_touch_one_cluster_slot_per_team() -> None:
    k = TeamKeys("cr", "team-a")
    names = [k.spend, k.reserved, k.res, k.lease, k.limits, k.ledger, k.rate(1), k.done(1)]
    assert len({key_slot(n.encode()) for n in names}) == 1
    assert team_of_key("cr", k.limits) == "team-a"


@pytest.mark.parametrize(
    "limit",
    [
        None,
        BudgetLimit(limit_usd=1.25, period="daily"),
        BudgetLimit(limit_usd=None, period="monthly", rpm=5),
        BudgetLimit(limit_usd=0.0, period="total", rpm=1, tpm=9),
    ],
)
def test_limits_survive_the_trip_through_the_scripts_encoding(limit: BudgetLimit | None) -> None:
    assert decode_limit(encode_limit(limit)) == limit


def test_unreachable_redis_fails_closed_by_default() -> None:
    settings = BudgetsConfig(
        store="redis",
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        key_prefix=random_prefix(),
        redis_timeout_s=0.2,
    )

    async def main() -> None:
        store = RedisBudgetStore(settings)
        with pytest.raises(BudgetUnavailable):
            await store.reserve(team(1.0), "a", 0.1, 1)
        assert not await store.ping()
        await store.redis.aclose()

    run(main())


def test_unreachable_redis_fails_open_by_config_and_journals_the_charge(tmp_path: Any) -> None:
    journal = tmp_path / "journal.jsonl"
    settings = BudgetsConfig(
        store="redis",
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        key_prefix=random_prefix(),
        redis_timeout_s=0.2,
        fail_mode="open",
        journal_path=str(journal),
    )

    async def main() -> None:
        store = RedisBudgetStore(settings)
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
    adopter = RedisBudgetStore(settings)
    assert "a" in adopter.journal.entries
    assert not (tmp_path / "journal.jsonl.1").exists()
    assert '"rid":"a"' in mine.read_text()
    adopter.journal.close()


def test_a_journal_with_a_line_it_cannot_read_is_left_for_an_operator(tmp_path: Any) -> None:
    """Adoption never passes over a charge: a torn or foreign line stops it, and the dead
    replica's file stays (what was adopted before it is replayed idempotently, by request id).
    In a child process: the failed adopter keeps its own journal's lock until it exits."""
    dead = tmp_path / "journal.jsonl.1"
    dead.write_bytes(b'{"rid": "a", "nanos": 5}\n\n{"rid": "b", "nan')
    base = str(tmp_path / "journal.jsonl")
    adopt = f"from policies.budgets.journal import Journal; Journal({base!r})"
    failed = subprocess.run([sys.executable, "-c", adopt], capture_output=True, text=True)
    assert failed.returncode != 0
    assert "journal.jsonl.1: line 3: not a journal entry" in failed.stderr
    assert dead.exists()
    dead.write_bytes(b'{"rid": "a", "nanos": 5}\n\n{"rid": "b", "nanos": 7}\n')
    journal = Journal(base)
    assert set(journal.entries) == {"a", "b"} and not dead.exists()
    journal.close()


def test_a_started_redis_store_keeps_its_leases_while_a_dead_replica_loses_them() -> None:
    """The background loop of a running replica renews (every lease_s / 3); the holds of one that
    stopped expire by Redis time. Waits on the outcome, with a deadline, not a fixed sleep."""
    prefix = random_prefix()
    settings = BudgetsConfig(
        store="redis", redis_url=REDIS_URL, key_prefix=prefix, lease_s=0.3, redis_timeout_s=5
    )

    async def main() -> None:
        live, dead = RedisBudgetStore(settings), RedisBudgetStore(settings)
        await live.start()
        await live.reserve(team(1.0), "long-stream", 0.5, 1)
        await dead.reserve(team(1.0), "orphan", 0.4, 1)  # reserved later: would expire later
        deadline = time.monotonic() + 10
        while (reserved := (await live.status(team(1.0)))[0].reserved_nanos) == usd_to_nanos(0.9):
            assert time.monotonic() < deadline, "the orphan's hold was never reclaimed"
            await asyncio.sleep(0.02)
        # The orphan's lease ran out, so the older, renewed one outlived its own lease_s.
        assert reserved == usd_to_nanos(0.5)
        assert (await live.settle("long-stream", 0.5, 1)).charged_nanos == usd_to_nanos(0.5)
        await live.aclose()
        await dead.aclose()

    try:
        run(main())
    finally:
        delete_prefix(prefix)


def test_a_started_memory_store_renews_its_holds_until_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """start() runs the renewer (every lease_s / 3 of real time); leases are measured by the
    store's clock, so the test moves that clock a whole lease at a time and waits for the
    renewer's next renewal, read from a spy on renew(), not for a fixed time."""
    clock = ManualClock()
    store = InMemoryBudgetStore(0.3, clock=clock)
    renewals: list[tuple[float, int]] = []  # (store time, holds renewed), one per renew()
    real_renew = store.renew

    async def spy() -> int:
        renewed = await real_renew()
        renewals.append((clock(), renewed))
        return renewed

    monkeypatch.setattr(store, "renew", spy)

    async def next_renewal() -> tuple[float, int]:
        seen = len(renewals)
        await asyncio.to_thread(
            wait_for, lambda: len(renewals) > seen, 10, "the background renewer's next renew()"
        )
        return renewals[-1]

    async def main() -> None:
        await store.start()
        reserved_at = clock()
        await store.reserve(team(1.0), "long-stream", 0.5, 1)
        for _ in range(3):  # three whole leases pass on the store's clock...
            clock.advance(0.3)
            assert await next_renewal() == (clock(), 1)  # ...each followed by a renewal
        assert clock() > reserved_at + 2 * 0.3  # long past the lease it was reserved with
        assert (await store.status(team(1.0)))[0].reserved_nanos == usd_to_nanos(0.5)

        await store.aclose()
        # No renewer is left to run: nothing extends the hold again, and its lease runs out.
        assert asyncio.all_tasks() == {asyncio.current_task()}
        clock.advance(0.3)
        assert (await store.status(team(1.0)))[0].reserved_nanos == 0

    run(main())


def test_the_in_process_store_remembers_settled_ids_as_long_as_redis_does() -> None:
    clock = ManualClock()
    store = InMemoryBudgetStore(60, clock=clock)

    async def main() -> None:
        await store.reserve(team(None), "r1", 0.5, 1)
        await store.settle("r1", 0.2, 1)
        clock.advance(DONE_TTL_S - 1)
        assert (await store.settle("r1", 0.2, 1)).duplicate
        with pytest.raises(ValueError):
            await store.reserve(team(None), "r1", 0.5, 1)
        clock.advance(2)  # forgotten, as Redis's done markers expire: memory stays bounded
        await store.reserve(team(None), "r1", 0.5, 1)

    run(main())
