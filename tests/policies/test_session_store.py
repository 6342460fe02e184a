"""The session store contract, checked on every budget store kind (memory, Redis, Redis Cluster).

As tests/policies/budgets/test_store_conformance.py: each check runs once per kind of
`policies.budgets.factory.STORE_KINDS`, through the same kits (real Redis, the real 3-master
cluster, a manual clock), and the session store is the one the proxy builds next to that budget
store (`policies.sessions.factory.session_store`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Iterator
from typing import Any

import pytest
import redis

from policies.budgets.factory import STORE_KINDS, build_stores
from policies.budgets.money import usd_to_nanos
from policies.budgets.scopes import BudgetScope
from policies.budgets.store import BudgetStore
from policies.config import BudgetLimit, BudgetsConfig
from policies.sessions.factory import session_store
from policies.sessions.modes import Move, Plan, plan
from policies.sessions.store import (
    SessionState,
    SessionStore,
    SessionUnavailable,
    apply,
    choose,
)
from tests.policies.budgets.test_store_conformance import KITS, StoreKit, new_kit
from tests.support.budgets import REDIS_URL
from tests.support.ports import free_port

TIERS = ["small", "medium", "large"]


@pytest.fixture(params=sorted(STORE_KINDS))
def kit(request: pytest.FixtureRequest) -> Iterator[StoreKit]:
    if request.param not in KITS:
        pytest.fail(f"store kind {request.param!r} has no kit: add one to run the checks")
    built = new_kit(request.param, request)
    yield built
    built.close()


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def sessions(kit: StoreKit) -> SessionStore:
    budget_store = kit.make()
    prefix = getattr(kit, "prefix", "cr")
    return session_store(budget_store, prefix, kit.clock)


async def close(*stores: SessionStore) -> None:
    """Close the Redis clients before the test's event loop ends."""
    for store in stores:
        client = getattr(store, "redis", None)
        if client is not None:
            await client.aclose()


def sticky(proposal: str) -> Plan:
    return plan("sticky", proposal, TIERS)


def test_a_new_session_takes_the_fresh_move_and_keeps_it(kit: StoreKit) -> None:
    async def main() -> None:
        store = sessions(kit)
        first = await store.step("t", "s1", sticky("large"), 120, 60)
        assert first.move == Move("large", "new")
        assert first.previous_tier is None
        assert first.state.last_tier == "large"
        assert first.state.tiers_used == ["large"]
        assert (first.state.prompt_tokens, first.state.requests) == (120, 1)
        second = await store.step("t", "s1", sticky("small"), 80, 60)
        assert second.move == Move("large", "held")
        assert second.previous_tier == "large"
        assert (second.state.prompt_tokens, second.state.requests) == (200, 2)
        loaded = await store.load("t", "s1")
        assert loaded is not None
        assert (loaded.last_tier, loaded.tiers_used, loaded.prompt_tokens) == (
            "large",
            ["large"],
            200,
        )
        assert loaded.last_seen == pytest.approx(kit.clock(), abs=0.01)
        assert await store.load("t", "other") is None
        await close(store)

    run(main())


def test_tiers_used_accumulate_and_a_one_off_move_is_not_recorded(kit: StoreKit) -> None:
    async def main() -> None:
        store = sessions(kit)
        await store.step("t", "s", plan("escalate_only", "small", TIERS), 10, 60)
        up = await store.step("t", "s", plan("escalate_only", "large", TIERS), 10, 60)
        assert up.move == Move("large", "escalated")
        down = await store.step("t", "s", plan("escalate_only", "small", TIERS), 10, 60)
        assert down.move == Move("large", "held")
        shed = await store.step("t", "s", plan("sticky", "small", TIERS, shed=True), 10, 60)
        assert shed.move == Move("small", "load_shed", record=False)
        state = await store.load("t", "s")
        assert state is not None
        assert state.last_tier == "large"  # load shedding moved one request, not the session
        assert state.tiers_used == ["small", "large"]
        assert state.requests == 4
        await close(store)

    run(main())


def test_same_results_as_the_pure_rules(kit: StoreKit) -> None:
    """Random plans through the store match `choose` + `apply` (session.lua is a copy of them)."""

    async def main() -> None:
        store = sessions(kit)
        rng = random.Random(7)
        model: dict[str, SessionState] = {}
        for i in range(120):
            key = f"s{rng.randrange(6)}"
            mode = rng.choice(["per_request", "sticky", "escalate_only"])
            p = plan(
                mode,
                rng.choice(TIERS),
                TIERS,
                tool_loop=rng.random() < 0.2,
                shed=rng.random() < 0.15,
            )
            tokens = rng.randrange(500)
            got = await store.step("t", key, p, tokens, 600)
            state = model.get(key)
            expect = choose(p, state.last_tier if state else None)
            model[key] = state = state or SessionState()
            apply(state, expect, tokens, 0.0)
            assert got.move == expect, i
            assert (got.state.last_tier, got.state.tiers_used) == (
                state.last_tier,
                state.tiers_used,
            )
            assert (got.state.prompt_tokens, got.state.requests) == (
                state.prompt_tokens,
                state.requests,
            )
        await close(store)

    run(main())


def test_state_expires_ttl_after_the_last_request(kit: StoreKit) -> None:
    first = sessions(kit)

    async def main() -> None:
        await first.step("t", "short", sticky("large"), 1, 0.2)
        await first.step("t", "long", sticky("large"), 1, 600)
        await close(first)

    async def after() -> None:
        # A shared kind's new client sees the same state (the first one's loop is gone).
        store = sessions(kit) if kit.shared else first
        assert await store.load("t", "short") is None
        assert await store.load("t", "long") is not None
        again = await store.step("t", "short", sticky("small"), 1, 0.2)
        assert again.move == Move("small", "new")  # expired: a new session
        await close(store)

    run(main())
    kit.elapse(0.5)
    run(after())


def test_replicas_share_sessions_and_agree_under_concurrency(kit: StoreKit) -> None:
    """Many requests of one new session at once, half proposing each tier, on two stores (two
    replicas where the kind is shared): every one lands on the same tier, the first applied."""

    async def main() -> None:
        a, b = sessions(kit), sessions(kit)
        replicas = [a, b] if kit.shared else [a, a]
        steps = await asyncio.gather(
            *(
                replicas[i % 2].step("t", "race", sticky(TIERS[2 * (i % 2)]), 1, 60)
                for i in range(40)
            )
        )
        tiers = {s.move.tier for s in steps}
        assert len(tiers) == 1
        assert sum(s.move.reason == "new" for s in steps) == 1
        assert max(s.state.requests for s in steps) == 40
        await close(a, b)

    run(main())


def test_a_session_is_a_few_hundred_bytes_in_one_slot(kit: StoreKit) -> None:
    if not kit.shared:
        pytest.skip("in process: no key to measure")

    async def main() -> str:
        store = sessions(kit)
        p = plan("escalate_only", "small", TIERS)
        await store.step("t", "sized", p, 10_000, 60)
        await store.step("t", "sized", plan("escalate_only", "large", TIERS), 10_000, 60)
        key = store.key("t", "sized")  # type: ignore[attr-defined]
        await store.redis.aclose()  # type: ignore[attr-defined]
        return key

    key = run(main())
    # The team's hash tag: the session is in one slot, the one of its team's budget keys (its
    # step rides on their reserve script).
    assert key.startswith(f"{getattr(kit, 'prefix', 'cr')}:{{t}}:session:")
    client: Any = (
        kit._cluster.client() if hasattr(kit, "_cluster") else redis.Redis.from_url(REDIS_URL)
    )
    with client:
        used = client.memory_usage(key)
        assert used is not None and used < 400, used
        assert 0 < client.pttl(key) <= 60_000


@pytest.mark.parametrize("kind", ["redis", "redis-cluster"])
def test_an_unreachable_store_is_session_unavailable(kind: str) -> None:
    async def main() -> None:
        settings = BudgetsConfig(
            store=kind, redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_timeout_s=0.5
        )
        budget_store, _ = build_stores(settings)
        store = session_store(budget_store, "cr")
        with pytest.raises(SessionUnavailable):
            await store.step("t", "s", sticky("large"), 1, 60)
        with pytest.raises(SessionUnavailable):
            await store.load("t", "s")
        await close(store)

    run(main())


# --- the step riding on the budget reserve (`step_reserving`) ------------------------------------
OPTIONS = {"small": (0.001, 50), "medium": None, "large": (0.004, 200)}


def budgets_of(store: SessionStore) -> BudgetStore:
    return store.budgets  # type: ignore[attr-defined,no-any-return]


def test_the_step_reserves_what_its_chosen_tier_needs(kit: StoreKit) -> None:
    """The request reserves the option of the tier the step chose, not the policy's proposal:
    sticky holds large against a proposal of small, and large's amount is what is held."""
    scope = BudgetScope("t", None, BudgetLimit(limit_usd=1.0, period="total"))

    async def main() -> None:
        store = sessions(kit)
        budgets = budgets_of(store)
        first = await store.step_reserving("t", "s", sticky("large"), 10, 60, scope, "r1", OPTIONS)
        assert first.step is not None and first.step.move == Move("large", "new")
        assert first.reservation is not None and first.refused is None
        assert first.reservation.amount_nanos == usd_to_nanos(0.004)
        second = await store.step_reserving("t", "s", sticky("small"), 10, 60, scope, "r2", OPTIONS)
        assert second.step is not None and second.step.move == Move("large", "held")
        assert second.reservation is not None
        assert second.reservation.amount_nanos == usd_to_nanos(0.004)
        (status,) = await budgets.status(scope)
        assert status.reserved_nanos == 2 * usd_to_nanos(0.004)
        await budgets.settle("r1", 0.003, 100)
        await budgets.release("r2")
        (status,) = await budgets.status(scope)
        assert (status.reserved_nanos, status.spent_nanos) == (0, usd_to_nanos(0.003))
        assert (await store.load("t", "s")).requests == 2  # type: ignore[union-attr]
        await close(store)

    run(main())


def test_a_refused_reserve_still_steps_and_holds_nothing(kit: StoreKit) -> None:
    """The budget refuses the chosen tier's amount: the step is taken (the session is on large,
    as when the budget check came after it), nothing is reserved, and the refusal says why."""
    scope = BudgetScope("t", None, BudgetLimit(limit_usd=0.002, period="total"))

    async def main() -> None:
        store = sessions(kit)
        done = await store.step_reserving("t", "s", sticky("large"), 10, 60, scope, "r1", OPTIONS)
        assert done.step is not None and done.step.move.tier == "large"
        assert done.reservation is None
        assert done.refused is not None and done.refused.reason == "budget"
        (status,) = await budgets_of(store).status(scope)
        assert status.reserved_nanos == 0
        assert (await store.load("t", "s")).last_tier == "large"  # type: ignore[union-attr]
        await close(store)

    run(main())


def test_a_tier_the_request_cannot_go_to_reserves_nothing(kit: StoreKit) -> None:
    scope = BudgetScope("t", None, BudgetLimit(limit_usd=1.0, period="total"))

    async def main() -> None:
        store = sessions(kit)
        done = await store.step_reserving("t", "s", sticky("medium"), 10, 60, scope, "r1", OPTIONS)
        assert done.step is not None and done.step.move.tier == "medium"
        assert (done.reservation, done.refused) == (None, None)
        (status,) = await budgets_of(store).status(scope)
        assert status.reserved_nanos == 0
        await close(store)

    run(main())


def test_a_retried_reserve_does_not_step_twice(kit: StoreKit) -> None:
    """The budget store retries a reserve whose answer was lost: the second run answers the
    hold it made, and the session counts the request once."""
    if not kit.shared:
        pytest.skip("in process: nothing is lost between the step and its answer")
    scope = BudgetScope("t", None, BudgetLimit(limit_usd=1.0, period="total"))

    async def main() -> None:
        store = sessions(kit)
        once = await store.step_reserving("t", "s", sticky("large"), 10, 60, scope, "r1", OPTIONS)
        again = await store.step_reserving("t", "s", sticky("large"), 10, 60, scope, "r1", OPTIONS)
        assert once.reservation is not None and again.reservation is not None
        assert again.reservation.amount_nanos == once.reservation.amount_nanos
        assert again.step is not None and again.step.move.tier == "large"
        state = await store.load("t", "s")
        assert state is not None and (state.requests, state.prompt_tokens) == (1, 10)
        (status,) = await budgets_of(store).status(scope)
        assert status.reserved_nanos == usd_to_nanos(0.004)
        await close(store)

    run(main())
