"""The in-process store has the same semantics as the Redis store: same operations, same answers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from policies.budgets import BudgetExceeded, BudgetScope, BudgetStore, InMemoryBudgetStore
from policies.redis_budgets import RedisBudgetStore
from router.config import BudgetLimit, BudgetsConfig
from tests.budget_helpers import REDIS_URL, delete_prefix, random_prefix

SCOPES = [
    BudgetScope("a", None, BudgetLimit(limit_usd=0.05, period="daily", rpm=12)),
    BudgetScope("a", "k", BudgetLimit(limit_usd=0.05, period="daily", rpm=12),
                BudgetLimit(limit_usd=0.02, period="monthly", tpm=4000)),
    BudgetScope("b", None, BudgetLimit(limit_usd=0.03, period="total")),
]

op = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 2), st.integers(0, 9_000_000),
              st.integers(0, 1500)),
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
def test_memory_and_redis_stores_answer_alike(ops: list[tuple[str, int, Any, int]]) -> None:
    prefix = random_prefix()

    async def main() -> tuple[list[Any], list[Any]]:
        memory = InMemoryBudgetStore(60)
        redis_store = RedisBudgetStore(BudgetsConfig(store="redis", redis_url=REDIS_URL,
                                                     key_prefix=prefix, redis_timeout_s=5))
        try:
            return await play(memory, ops), await play(redis_store, ops)
        finally:
            await redis_store.aclose()

    minute = int(time.time() // 60)
    try:
        mem, red = asyncio.run(main())
    finally:
        delete_prefix(prefix)
    # rpm/tpm windows are UTC minutes: a run that straddled a minute boundary is not comparable.
    assume(int(time.time() // 60) == minute)
    assert mem == red
