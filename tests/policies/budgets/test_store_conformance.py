"""The BudgetStore contract, checked on every store kind the factory can build.

Like scikit-learn's `parametrize_with_checks`: each check runs once per kind of
`policies.budgets.factory.STORE_KINDS`, and a kind without a kit in `KITS` fails every check, so a
new store cannot ship without passing them. The kits build stores through the factory (as the
proxy does) with a manual clock, so periods and rpm/tpm minutes move when a check says so. Lease
expiry is the one thing a store may measure by its own clock (Redis: server time); `elapse`
waits for that clock instead of sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.base import BudgetView
from policies.budgets.factory import STORE_KINDS, build_stores
from policies.budgets.ledger import spend_from_ledger
from policies.budgets.money import nanos_to_usd, usd_to_nanos
from policies.budgets.periods import period_window
from policies.budgets.scopes import BudgetScope
from policies.budgets.store import BudgetExceeded, BudgetStore, BudgetUnavailable
from policies.config import BudgetLimit, BudgetsConfig
from policies.keys import KeyRecord, KeyStore
from router.config import config_from_dict
from tests.support.budgets import (
    REDIS_URL,
    ManualClock,
    delete_prefix,
    random_prefix,
    wait_for_redis_time,
)
from tests.support.redis_cluster import RunningCluster
from trace_format.config_base import ConfigError

# --- one kit per store kind ---------------------------------------------------------------------


class StoreKit(ABC):
    """Builds stores of one kind that share one manual clock (and, where the kind has one, one
    shared backend), and lets time pass for them."""

    shared = False  # do two stores of this kind see each other's state (replicas of one store)?

    def __init__(self) -> None:
        self.clock = ManualClock()

    @abstractmethod
    def settings(self, **overrides: Any) -> BudgetsConfig: ...

    def build(self, lease_s: float = 60.0, timezone: str = "UTC") -> tuple[BudgetStore, KeyStore]:
        return build_stores(self.settings(lease_s=lease_s, timezone=timezone), self.clock)

    def make(self, lease_s: float = 60.0, timezone: str = "UTC") -> BudgetStore:
        return self.build(lease_s, timezone)[0]

    def elapse(self, seconds: float) -> None:
        """`seconds` pass for every clock the stores read (leases included)."""
        self.clock.advance(seconds)

    def close(self) -> None:
        return None


class MemoryKit(StoreKit):
    def settings(self, **overrides: Any) -> BudgetsConfig:
        return BudgetsConfig(store="memory", **overrides)


class RedisKit(StoreKit):
    """The real Redis at REDIS_URL under a random key prefix, removed afterwards."""

    shared = True

    def __init__(self) -> None:
        super().__init__()
        self.prefix = random_prefix()
        self._client = redis.Redis.from_url(REDIS_URL)

    def settings(self, **overrides: Any) -> BudgetsConfig:
        # A generous timeout: a loaded CI machine must not turn a slow reply into an outage.
        return BudgetsConfig(
            store="redis",
            redis_url=REDIS_URL,
            key_prefix=self.prefix,
            redis_timeout_s=5,
            **overrides,
        )

    def elapse(self, seconds: float) -> None:
        super().elapse(seconds)
        wait_for_redis_time(self._client, seconds)  # leases expire by Redis server time

    def close(self) -> None:
        self._client.close()
        delete_prefix(self.prefix)


class RedisClusterKit(StoreKit):
    """The session's real 3-master Redis Cluster (tests/conftest.py `redis_cluster`) under a
    random key prefix, removed afterwards."""

    shared = True
    needs_cluster = True

    def __init__(self, cluster: RunningCluster) -> None:
        super().__init__()
        self.prefix = random_prefix()
        self.url = cluster.url
        self._cluster = cluster
        self._node = cluster.masters()[0].client()

    def settings(self, **overrides: Any) -> BudgetsConfig:
        return BudgetsConfig(
            store="redis-cluster",
            redis_url=self.url,
            key_prefix=self.prefix,
            redis_timeout_s=5,
            **overrides,
        )

    def elapse(self, seconds: float) -> None:
        super().elapse(seconds)
        wait_for_redis_time(self._node, seconds)  # every node runs on this machine's clock

    def close(self) -> None:
        self._cluster.delete_prefix(self.prefix)
        self._node.close()


KITS: dict[str, type[StoreKit]] = {
    "memory": MemoryKit,
    "redis": RedisKit,
    "redis-cluster": RedisClusterKit,
}


def new_kit(kind: str, request: pytest.FixtureRequest) -> StoreKit:
    cls = KITS[kind]
    if getattr(cls, "needs_cluster", False):
        return cls(request.getfixturevalue("redis_cluster"))  # type: ignore[call-arg]
    return cls()


@pytest.fixture(params=sorted(STORE_KINDS))
def kit(request: pytest.FixtureRequest) -> Iterator[StoreKit]:
    if request.param not in KITS:
        pytest.fail(f"store kind {request.param!r} has no kit in KITS: add one to run the checks")
    built = new_kit(request.param, request)
    yield built
    built.close()


def test_the_config_accepts_exactly_the_store_kinds_and_each_has_a_kit() -> None:
    assert set(STORE_KINDS) == set(KITS)
    base = {
        "tiers": [
            {
                "name": "t",
                "base_url": "http://127.0.0.1:9/v1",
                "model": "m",
                "price": {"input_per_mtok": 1, "output_per_mtok": 1},
            }
        ]
    }
    for kind in STORE_KINDS:
        assert config_from_dict({**base, "budgets": {"store": kind}}, environ={}).budgets.store
    with pytest.raises(ConfigError, match=r"budgets\.store: unknown budget store 'sqlite'"):
        config_from_dict({**base, "budgets": {"store": "sqlite"}}, environ={})
    with pytest.raises(ConfigError, match=r"budgets\.store"):
        build_stores(BudgetsConfig(store="sqlite"))


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def team(limit: float | None, period: str = "daily", **kw: Any) -> BudgetScope:
    return BudgetScope("alpha", None, BudgetLimit(limit_usd=limit, period=period, **kw))


# --- the checks ---------------------------------------------------------------------------------


def test_reserve_settle_release_keep_exact_accounts(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
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
        window = period_window("daily", kit.clock(), ZoneInfo("UTC"))
        assert await store.view(scope) == BudgetView(
            1.0, 0.123456789, 0.0, window.elapsed_fraction(kit.clock())
        )
        ledger = await store.ledger("alpha")
        assert [(e.request_id, e.nanos, e.kind) for e in ledger] == [("r1", 123_456_789, "settle")]
        await store.aclose()

    run(main())


def test_reserving_a_held_id_again_returns_the_same_hold(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
        first = await store.reserve(team(1.0), "r1", 0.4, 100)
        again = await store.reserve(team(1.0), "r1", 0.4, 100)
        assert (again.amount_nanos, again.tokens, again.periods) == (
            first.amount_nanos,
            first.tokens,
            first.periods,
        )
        assert (await store.status(team(1.0)))[0].reserved_nanos == usd_to_nanos(0.4)
        with pytest.raises(KeyError):
            await store.settle("never-reserved", 0.1, 1)
        await store.aclose()

    run(main())


def test_reservation_that_does_not_fit_is_refused_with_time_to_reset(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
        scope = team(1.0)
        await store.reserve(scope, "r1", 0.6, 10)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(scope, "r2", 0.5, 10)
        assert err.value.reason == "budget" and err.value.scope == "alpha"
        window = period_window("daily", kit.clock(), ZoneInfo("UTC"))
        assert err.value.retry_after_s == pytest.approx(window.end - kit.clock(), abs=1e-3)
        await store.reserve(scope, "r3", 0.4, 10)  # exactly fills the limit: allowed
        with pytest.raises(BudgetExceeded):
            await store.reserve(scope, "r4", 0.000000001, 10)
        total = BudgetScope("alpha", None, BudgetLimit(limit_usd=0.0, period="total"))
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(total, "r5", 0.1, 10)
        assert err.value.retry_after_s is None  # a total budget never resets
        await store.aclose()

    run(main())


def test_a_spend_refusal_reports_limit_spent_reserved_and_amount(kit: StoreKit) -> None:
    """What the request path's refusal message and its Retry-After are decided by."""

    async def main() -> None:
        store = kit.make()
        scope = team(1.0)
        await store.reserve(scope, "r1", 0.3, 10)
        await store.settle("r1", 0.3, 10)
        await store.reserve(scope, "r2", 0.5, 10)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(scope, "r3", 0.4, 10)
        s = err.value.standing
        assert s is not None and s.period == "daily"
        assert (s.limit_nanos, s.spent_nanos, s.reserved_nanos, s.amount_nanos) == (
            usd_to_nanos(1.0),
            usd_to_nanos(0.3),
            usd_to_nanos(0.5),
            usd_to_nanos(0.4),
        )
        assert s.remaining_nanos == usd_to_nanos(0.2)
        assert s.fits_without_reservations and not s.never_fits
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(scope, "r4", 1.5, 10)
        assert err.value.standing is not None and err.value.standing.never_fits
        await store.aclose()

    run(main())


def test_a_new_period_starts_with_fresh_spend(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
        scope = team(1.0)
        await store.reserve(scope, "r1", 0.9, 10)
        await store.settle("r1", 0.9, 10)
        before = (await store.status(scope))[0]
        kit.clock.advance(before.resets_at - kit.clock() + 1)  # into the next day
        after = (await store.status(scope))[0]
        assert after.period_id != before.period_id and after.spent_nanos == 0
        await store.reserve(scope, "r2", 0.9, 10)
        assert await store.spend("alpha") == {("team", before.period_id): usd_to_nanos(0.9)}
        await store.aclose()

    run(main())


def test_concurrent_reservations_never_exceed_the_limit(kit: StoreKit) -> None:
    rng = random.Random(7)
    amounts = [rng.randint(1, 40_000_000) / 1e9 for _ in range(300)]

    async def main() -> None:
        store = kit.make()
        scope = team(1.5)

        unavailable: list[int] = []

        async def one(i: int) -> int:
            try:
                res = await store.reserve(scope, f"r{i}", amounts[i], 1)
            except BudgetExceeded:
                return 0
            except BudgetUnavailable:
                # Refused, fail closed: the right answer of a store that lost a connection. In
                # a 300-request burst on the cluster, redis-py's cluster client can turn one
                # connection error into a few (after an error it disconnects the node's idle
                # connections while other tasks are taking them); seen twice in 1,141-test
                # runs. Rare, never the rule: bounded below.
                unavailable.append(i)
                return 0
            await asyncio.sleep(0)  # let the other requests interleave
            actual = nanos_to_usd(res.amount_nanos) * rng.choice([0.25, 0.5, 1.0])
            return (await store.settle(f"r{i}", actual, 1)).charged_nanos

        charged = await asyncio.gather(*(one(i) for i in range(300)))
        assert len(unavailable) <= 300 // 20, f"{len(unavailable)} of 300 refused as unreachable"
        st = (await store.status(scope))[0]
        assert st.spent_nanos == sum(charged) <= usd_to_nanos(1.5)
        assert st.reserved_nanos == 0
        assert sum(e.nanos for e in await store.ledger("alpha")) == st.spent_nanos
        assert spend_from_ledger(await store.ledger("alpha")) == await store.spend("alpha")
        await store.aclose()

    run(main())


def test_settle_is_idempotent_by_request_id(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
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


def test_a_settle_above_the_reservation_charges_the_reservation_and_records_the_overage(
    kit: StoreKit,
) -> None:
    async def main() -> None:
        store = kit.make()
        scope = team(1.0, tpm=1000)
        await store.reserve(scope, "r1", 0.4, 100)
        settled = await store.settle("r1", 1_200_000_000.0, 10**8)  # absurd usage: $1.2 billion
        assert (settled.charged_nanos, settled.overage_nanos) == (
            usd_to_nanos(0.4),
            usd_to_nanos(1_200_000_000.0) - usd_to_nanos(0.4),
        )
        st = (await store.status(scope))[0]
        assert (st.spent_nanos, st.reserved_nanos) == (usd_to_nanos(0.4), 0)
        [entry] = await store.ledger("alpha")
        assert (entry.kind, entry.nanos, entry.overage_nanos) == (
            "settle",
            usd_to_nanos(0.4),
            settled.overage_nanos,
        )
        assert spend_from_ledger([entry]) == await store.spend("alpha")  # overage is no spend
        await store.reserve(scope, "r2", 0.6, 900)  # tpm took the reserved 100 tokens, not 10**8
        again = await store.settle("r1", 0.1, 1)
        assert again.duplicate and again.charged_nanos == usd_to_nanos(0.4)
        await store.aclose()

    run(main())


def test_a_settle_without_a_live_reservation_is_capped_by_the_one_made(kit: StoreKit) -> None:
    """The direct path: the lease was reclaimed before the (slow) request settled."""

    async def main() -> None:
        dead, next_store = await _holds_of_a_dead_replica(kit)
        assert await next_store.sweep() == 2
        settled = await dead.settle("lost-1", 50.0, 10)  # reserved 0.6
        assert (settled.charged_nanos, settled.overage_nanos) == (
            usd_to_nanos(0.6),
            usd_to_nanos(50.0) - usd_to_nanos(0.6),
        )
        assert (await dead.settle("lost-2", 0.1, 10)).charged_nanos == usd_to_nanos(0.1)
        entries = await next_store.ledger("alpha")
        assert [(e.kind, e.nanos) for e in entries] == [
            ("direct", usd_to_nanos(0.6)),
            ("direct", usd_to_nanos(0.1)),
        ]
        st = (await next_store.status(team(1.0)))[0]
        assert (st.spent_nanos, st.reserved_nanos) == (usd_to_nanos(0.7), 0)
        await _close(dead, next_store)

    run(main())


def test_a_negative_actual_cost_never_credits(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
        scope = team(1.0, tpm=1000)
        await store.reserve(scope, "r0", 0.3, 10)
        await store.settle("r0", 0.3, 10)
        await store.reserve(scope, "r1", 0.4, 100)
        settled = await store.settle("r1", -120.0, -(10**6))
        assert (settled.charged_nanos, settled.overage_nanos) == (0, 0)
        st = (await store.status(scope))[0]
        assert (st.spent_nanos, st.reserved_nanos) == (usd_to_nanos(0.3), 0)
        assert [e.nanos for e in await store.ledger("alpha")] == [usd_to_nanos(0.3), 0]
        with pytest.raises(BudgetExceeded):  # the window was not credited with -10**6 tokens
            await store.reserve(scope, "r2", 0.1, 1000)
        await store.aclose()

    run(main())


def test_release_frees_the_hold_and_its_tokens(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
        scope = team(1.0, tpm=1000)
        await store.reserve(scope, "r1", 0.8, 900)
        with pytest.raises(BudgetExceeded):
            await store.reserve(scope, "r2", 0.5, 10)
        await store.release("r1")
        await store.release("r1")  # a second release (or of an unknown id) is a no-op
        st = (await store.status(scope))[0]
        assert (st.spent_nanos, st.reserved_nanos) == (0, 0)
        await store.reserve(scope, "r2", 1.0, 1000)  # budget and tokens both given back
        assert await store.ledger("alpha") == []  # a release charges nothing
        await store.aclose()

    run(main())


async def _holds_of_a_dead_replica(kit: StoreKit) -> tuple[BudgetStore, BudgetStore]:
    """A replica that reserves 0.9 of alpha's 1.0 and then dies (its leases run out unrenewed),
    and the store that serves the next request: another replica where the kind is shared."""
    dead = kit.make(lease_s=0.2)
    scope = team(1.0)
    await dead.reserve(scope, "lost-1", 0.6, 10)
    await dead.reserve(scope, "lost-2", 0.3, 10)
    with pytest.raises(BudgetExceeded):
        await dead.reserve(scope, "r3", 0.5, 10)
    kit.elapse(0.25)
    return dead, kit.make(lease_s=0.2) if kit.shared else dead


async def _close(dead: BudgetStore, next_store: BudgetStore) -> None:
    await dead.aclose()
    if next_store is not dead:
        await next_store.aclose()


def test_a_reserve_reclaims_expired_leases_itself(kit: StoreKit) -> None:
    """No sweep has run: the next reserve frees the expired holds before it checks the limit."""

    async def main() -> None:
        dead, next_store = await _holds_of_a_dead_replica(kit)
        await next_store.reserve(team(1.0), "r3", 0.9, 10)  # fits only if both were freed
        assert await next_store.sweep() == 0  # the reserve left the sweeper nothing to free
        st = (await next_store.status(team(1.0)))[0]
        assert st.reserved_nanos == usd_to_nanos(0.9) and st.spent_nanos == 0
        await _close(dead, next_store)

    run(main())


def test_the_sweeper_reclaims_expired_leases_without_any_request(kit: StoreKit) -> None:
    async def main() -> None:
        dead, next_store = await _holds_of_a_dead_replica(kit)
        assert await next_store.sweep() == 2
        assert await next_store.sweep() == 0  # freed once, not again
        st = (await next_store.status(team(1.0)))[0]
        assert st.reserved_nanos == 0 and st.spent_nanos == 0
        await _close(dead, next_store)

    run(main())


def test_renewed_leases_outlive_lease_s_and_unrenewed_ones_do_not(kit: StoreKit) -> None:
    async def main() -> None:
        live = kit.make(lease_s=0.3)
        await live.reserve(team(1.0), "long-stream", 0.5, 1)
        orphan = kit.make(lease_s=0.3)  # another replica of the same kind, which then dies
        await orphan.reserve(team(1.0), "orphan", 0.4, 1)
        for _ in range(3):  # three lease lengths in all; a running store renews every lease_s/3
            kit.elapse(0.3 / 3)
            assert await live.renew() == 1
        kit.elapse(0.3 / 3)
        # The renewed hold is still there; the orphan's is gone wherever it was visible.
        assert (await live.status(team(1.0)))[0].reserved_nanos == usd_to_nanos(0.5)
        seen_by_orphan = usd_to_nanos(0.5) if kit.shared else 0
        assert (await orphan.status(team(1.0)))[0].reserved_nanos == seen_by_orphan
        assert (await live.settle("long-stream", 0.5, 1)).charged_nanos == usd_to_nanos(0.5)
        await live.aclose()
        await orphan.aclose()

    run(main())


def test_team_and_key_limits_are_both_enforced(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
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
        assert (team_st.scope, key_st.scope) == ("team", "key:k1")
        assert team_st.reserved_nanos == usd_to_nanos(1.0)
        assert key_st.reserved_nanos == usd_to_nanos(0.3)
        await store.aclose()

    run(main())


def test_requests_and_tokens_per_minute(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
        scope = team(None, rpm=3, tpm=1000)
        await store.reserve(scope, "a", 0.0, 600)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(scope, "b", 0.0, 500)
        assert err.value.reason == "tpm"
        assert err.value.retry_after_s == pytest.approx(60 - kit.clock() % 60, abs=1e-3)
        await store.settle("a", 0.0, 100)  # tpm is corrected to the tokens really used
        await store.reserve(scope, "b", 0.0, 500)
        await store.reserve(scope, "c", 0.0, 100)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(scope, "d", 0.0, 1)
        assert err.value.reason == "rpm"
        kit.clock.advance(60)  # the next minute has its own counts
        await store.reserve(scope, "d", 0.0, 1000)
        await store.aclose()

    run(main())


def test_operator_override_reset_ledger_spend_and_teams(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make()
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
        assert (
            rebuilt
            == await store.spend("alpha")
            == {("team", (await store.status(scope))[0].period_id): usd_to_nanos(0.1)}
        )
        await store.set_limit("beta", "k9", BudgetLimit(rpm=1))  # a key override: beta has state
        assert {"alpha", "beta"} <= set(await store.teams())
        key_scope = BudgetScope("beta", "k9")
        await store.reserve(key_scope, "c", 0.0, 1)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(key_scope, "d", 0.0, 1)
        assert (err.value.scope, err.value.reason) == ("beta/key:k9", "rpm")
        await store.aclose()

    run(main())


def test_period_ids_follow_the_configured_zone(kit: StoreKit) -> None:
    async def main() -> None:
        store = kit.make(timezone="Pacific/Kiritimati")  # UTC+14: often already tomorrow
        scope = team(1.0, period="daily")
        res = await store.reserve(scope, "a", 0.1, 1)
        st = (await store.status(scope))[0]
        window = period_window("daily", kit.clock(), ZoneInfo("Pacific/Kiritimati"))
        assert res.periods["team"] == st.period_id == window.id
        assert st.resets_at == window.end
        await store.aclose()

    run(main())


@pytest.mark.parametrize(("period", "length_s"), [("hourly", 3600), ("weekly", 7 * 86400)])
def test_hourly_and_weekly_limits_reset_at_their_boundary_in_the_zone(
    kit: StoreKit, period: str, length_s: int
) -> None:
    """A week starts on Monday at local midnight, an hour at the local hour, in
    budgets.timezone (UTC+14 here, so the local boundary is not the UTC one)."""

    async def main() -> None:
        zone = "Pacific/Kiritimati"
        store = kit.make(timezone=zone)
        scope = team(1.0, period=period)
        window = period_window(period, kit.clock(), ZoneInfo(zone))
        assert window.end is not None and window.end - window.start == length_s
        await store.reserve(scope, "a", 0.9, 1)
        await store.settle("a", 0.9, 1)
        with pytest.raises(BudgetExceeded) as err:
            await store.reserve(scope, "b", 0.2, 1)
        assert err.value.retry_after_s == pytest.approx(window.end - kit.clock(), abs=1e-3)
        st = (await store.status(scope))[0]
        assert (st.period, st.period_id, st.resets_at) == (period, window.id, window.end)
        kit.clock.advance(window.end - kit.clock() - 1)  # one second before the boundary
        with pytest.raises(BudgetExceeded):
            await store.reserve(scope, "c", 0.2, 1)
        kit.clock.advance(2)  # the next window: spend starts from zero
        await store.reserve(scope, "d", 0.9, 1)
        st = (await store.status(scope))[0]
        assert st.period_id != window.id and (st.spent_nanos, st.reserved_nanos) == (
            0,
            usd_to_nanos(0.9),
        )
        if period == "weekly":
            start = datetime.fromtimestamp(window.end, ZoneInfo(zone))
            assert (start.weekday(), start.hour, start.minute) == (0, 0, 0)  # Monday 00:00
        await store.settle("d", 0.5, 1)
        assert await store.reset("alpha") == usd_to_nanos(0.5)  # the reset covers the new periods
        await store.aclose()

    run(main())


def test_key_store_keeps_records(kit: StoreKit) -> None:
    async def main() -> None:
        store, keys = kit.build()
        record = KeyRecord("ab" * 32, "alpha", "ann", "ci", created=1.0)
        assert await keys.get(record.key_sha256) is None
        await keys.put(record)
        assert await keys.get(record.key_sha256) == record
        assert await keys.all() == [record]
        await store.aclose()

    run(main())


# --- every kind answers alike: random operation sequences --------------------------------------

SCOPES = [
    BudgetScope("a", None, BudgetLimit(limit_usd=0.05, period="daily", rpm=12)),
    BudgetScope(
        "a",
        "k",
        BudgetLimit(limit_usd=0.05, period="daily", rpm=12),
        BudgetLimit(limit_usd=0.02, period="monthly", tpm=4000),
    ),
    BudgetScope("b", None, BudgetLimit(limit_usd=0.03, period="total")),
]

op = st.one_of(
    st.tuples(
        st.just("reserve"), st.integers(0, 2), st.integers(0, 9_000_000), st.integers(0, 1500)
    ),
    st.tuples(st.just("settle"), st.integers(0, 15), st.floats(0, 1), st.integers(0, 1500)),
    st.tuples(st.just("release"), st.integers(0, 15), st.just(0), st.just(0)),
)


async def play(store: BudgetStore, ops: list[tuple[str, int, Any, int]]) -> list[Any]:
    out: list[Any] = []
    reserved: dict[int, int] = {}  # op index -> nanos, for the ids that got a reservation
    for i, (kind, arg, amount, tokens) in enumerate(ops):
        if kind == "reserve":
            try:
                res = await store.reserve(SCOPES[arg], f"r{i}", amount / 1e9, tokens)
                reserved[i] = res.amount_nanos
                out.append(("ok", res.amount_nanos, sorted(res.periods)))
            except BudgetExceeded as exc:
                out.append(("refused", exc.scope, exc.reason))
            continue
        ids = sorted(reserved)
        if not ids:
            continue
        target = ids[arg % len(ids)]
        if kind == "settle":
            s = await store.settle(f"r{target}", reserved[target] * amount / 1e9, tokens)
            out.append(("settled", s.charged_nanos, s.duplicate))
        else:
            await store.release(f"r{target}")
            reserved.pop(target)
    for scope in SCOPES:
        out.append([(s.scope, s.spent_nanos, s.reserved_nanos) for s in await store.status(scope)])
    out.append([sum(e.nanos for e in await store.ledger(t)) for t in ("a", "b")])
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=40))
def test_every_store_kind_answers_random_sequences_alike(
    request: pytest.FixtureRequest,
    ops: list[tuple[str, int, Any, int]],
) -> None:
    # One clock for all kinds that does not move: the same periods and minute for every run.
    kits = [new_kit(kind, request) for kind in sorted(STORE_KINDS)]
    for k in kits[1:]:
        k.clock = kits[0].clock

    async def main() -> list[list[Any]]:
        stores = [k.make() for k in kits]
        try:
            return [await play(s, ops) for s in stores]
        finally:
            for s in stores:
                await s.aclose()

    try:
        answers = asyncio.run(main())
    finally:
        for k in kits:
            k.close()
    assert all(a == answers[0] for a in answers[1:])
