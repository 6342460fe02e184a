"""Latency of the budget check: reserve (one Lua round trip) + settle (one more), per request.

Runs against a real Redis (default 127.0.0.1:6379, loopback) under a throw-away key prefix, and
the in-process store for reference. Sequential requests measure the check alone; `--concurrency`
adds concurrent requests from one event loop (as one proxy process would issue them).
Only `reserve` is on a request's critical path (the proxy settles after the response is sent);
two plain PINGs, measured in the same run, show what the machine's scheduling noise alone costs.

    .venv/bin/python benchmarks/budget_check.py --requests 5000 --concurrency 1 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

from policies.budgets.memory import InMemoryBudgetStore
from policies.budgets.redis_store import RedisBudgetStore
from policies.budgets.scopes import BudgetScope
from policies.budgets.store import BudgetStore
from policies.config import BudgetLimit, BudgetsConfig


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(
    store: BudgetStore, requests: int, concurrency: int, check: str
) -> tuple[list[float], float]:
    scope = BudgetScope(
        "bench",
        "k1",
        BudgetLimit(limit_usd=1e6, period="monthly", rpm=10**9),
        BudgetLimit(limit_usd=1e5, period="daily"),
    )
    samples: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            t0 = time.perf_counter()
            if check == "2 x PING":
                await store.redis.ping()  # type: ignore[attr-defined]
                await store.redis.ping()  # type: ignore[attr-defined]
            else:
                await store.reserve(scope, f"r{i}", 0.0123, 1100)
                if check == "reserve":
                    samples.append((time.perf_counter() - t0) * 1000)
                await store.settle(f"r{i}", 0.0061, 600)
            if check != "reserve":
                samples.append((time.perf_counter() - t0) * 1000)

    for i in range(300):  # warm-up: connections, script cache
        await one(-i - 1)
    samples.clear()
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    return samples, time.perf_counter() - start


async def cleanup(store: RedisBudgetStore) -> None:
    keys = [k async for k in store.redis.scan_iter(match=f"{store.prefix}:*", count=1000)]
    for i in range(0, len(keys), 500):
        await store.redis.delete(*keys[i : i + 500])


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    a = ap.parse_args()
    load = os.getloadavg()[0]
    rows = []
    plan = [
        ("memory", "reserve"),
        ("memory", "reserve+settle"),
        ("redis", "2 x PING"),
        ("redis", "reserve"),
        ("redis", "reserve+settle"),
    ]
    for conc in a.concurrency:
        for kind, check in plan:
            if kind == "redis":
                store: BudgetStore = RedisBudgetStore(
                    BudgetsConfig(
                        store="redis",
                        redis_url=a.redis_url,
                        key_prefix=f"bench-{uuid.uuid4().hex[:8]}",
                    )
                )
            else:
                store = InMemoryBudgetStore(120)
            samples, wall = await measure(store, a.requests, conc, check)
            if isinstance(store, RedisBudgetStore):
                await cleanup(store)
            await store.aclose()
            rows.append(
                (
                    kind,
                    check,
                    conc,
                    statistics.median(samples),
                    percentile(samples, 0.99),
                    a.requests / wall,
                )
            )
    print(f"load average before the run: {load:.2f} on {os.cpu_count()} CPUs")
    print(f"{'store':<7} {'check':<20} {'conc':>4} {'p50 ms':>8} {'p99 ms':>8} {'checks/s':>9}")
    for kind, check, conc, p50, p99, rate in rows:
        print(f"{kind:<7} {check:<20} {conc:>4} {p50:>8.3f} {p99:>8.3f} {rate:>9.0f}")


if __name__ == "__main__":
    asyncio.run(main())
