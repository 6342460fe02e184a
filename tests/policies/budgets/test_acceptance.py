"""Acceptance: exact budgets across two proxy processes sharing one real Redis, replica death,
and Redis outages (on a private redis-server with AOF; the shared one on 6379 is never stopped).
Each test ends with the budget audit invariant (tests/support/audit.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from backends.config import Price
from benchmarks.echo_upstream import running_echo_upstream
from policies.budgets.estimate import prompt_token_bound
from policies.budgets.ledger import spend_from_ledger
from policies.budgets.money import usd_to_nanos
from policies.budgets.redis_store import RedisBudgetStore
from policies.config import BudgetLimit, BudgetsConfig
from policies.keys import hash_key
from tests.support.audit import Told, check_budget_invariant
from tests.support.budgets import (
    REDIS_URL,
    delete_prefix,
    private_redis,
    proxies,
    random_prefix,
)

TEAMS = ["t0", "t1", "t2", "t3"]
LARGE = Price(input_per_mtok=100, output_per_mtok=1000)
SMALL = Price(input_per_mtok=10, output_per_mtok=100)
MAX_TOKENS = 8  # the echo upstream answers 8 completion tokens
ACTUAL_LARGE_NANOS = 5 * 100 * 1000 + MAX_TOKENS * 1000 * 1000  # a 5-word prompt on the large tier
LIMIT_NANOS = 50 * ACTUAL_LARGE_NANOS  # each team's budget fits about 50 requests


def key_of(team: str) -> str:
    return f"sk-test-{team}"


def body(team: str, i: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "auto",
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": f"team {team} asks question {i}"}],
        **extra,
    }


def worst_nanos(price: Price, b: dict[str, Any]) -> int:
    prompt = prompt_token_bound(b)
    return round(prompt * price.input_per_mtok * 1000 + MAX_TOKENS * price.output_per_mtok * 1000)


def write_config(
    path: Path,
    upstream: str,
    prefix: str,
    redis_url: str = REDIS_URL,
    traces: Path | None = None,
    **budgets: Any,
) -> Path:
    cfg = {
        "tiers": [
            {
                "name": "small",
                "base_url": upstream,
                "model": "echo-small",
                "price": SMALL.model_dump(),
                "max_inflight": 512,
                "timeout_s": 30,
            },
            {
                "name": "large",
                "base_url": upstream,
                "model": "echo-large",
                "price": LARGE.model_dump(),
                "max_inflight": 512,
                "timeout_s": 30,
            },
        ],
        # Threshold 0: every request asks for the large tier; the budget decides the rest.
        "default_policy": "balanced",
        "policies": {
            "balanced": {"type": "threshold", "threshold": 0.0, "small": "small", "large": "large"}
        },
        "teams": {
            t: {"budget": {"limit_usd": LIMIT_NANOS / 1e9, "period": "total"}} for t in TEAMS
        },
        "keys": [{"key_sha256": hash_key(key_of(t)), "team": t} for t in TEAMS],
        "auth": {"required": True},
        "budgets": {
            "store": "redis",
            "redis_url": redis_url,
            "key_prefix": prefix,
            "redis_timeout_s": 5,
            **budgets,
        },
        "traces": {"path": None if traces is None else str(traces)},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


LIMITS = {t: BudgetLimit(limit_usd=LIMIT_NANOS / 1e9, period="total") for t in TEAMS}


def audit(
    prefix: str, told: Told, redis_url: str = REDIS_URL, traces: list[Path] | None = None
) -> None:
    """The budget audit invariant over every team, as the proxies' store sees it."""
    settings = BudgetsConfig(store="redis", redis_url=redis_url, key_prefix=prefix)
    check_budget_invariant(settings, LIMITS, told, traces or [])


class Ledger:
    """Reads the raw Redis state the proxies share."""

    def __init__(self, prefix: str, url: str = REDIS_URL) -> None:
        self.prefix = prefix
        self.r = redis.Redis.from_url(url)

    def base(self, team: str) -> str:
        return f"{self.prefix}:{{{team}}}"

    def spent(self, team: str) -> int:
        return int(self.r.hget(self.base(team) + ":spend", "team|total") or 0)

    def reserved(self, team: str) -> int:
        return int(self.r.hget(self.base(team) + ":reserved", "team") or 0)

    def open_reservations(self, team: str) -> int:
        return int(self.r.hlen(self.base(team) + ":res")) + int(
            self.r.zcard(self.base(team) + ":lease")
        )

    def entries(self, team: str) -> list[dict[str, str]]:
        raw = self.r.xrange(self.base(team) + ":ledger")
        return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in raw]

    def ledger_sum(self, team: str) -> int:
        return sum(int(e["nanos"]) for e in self.entries(team))

    def rebuilt_matches(self, team: str) -> bool:
        """`cost-router budget audit`'s check: spend rebuilt from the ledger == stored spend."""
        url = self.r.connection_pool.connection_kwargs
        settings = BudgetsConfig(
            store="redis",
            key_prefix=self.prefix,
            redis_url=f"redis://{url['host']}:{url['port']}/0",
        )

        async def check() -> bool:
            store = RedisBudgetStore(settings)
            try:
                return spend_from_ledger(await store.ledger(team)) == await store.spend(team)
            finally:
                await store.aclose()

        return asyncio.run(check())

    def wait_settled(self, teams: list[str], timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self.reserved(t) == 0 and self.open_reservations(t) == 0 for t in teams):
                return
            time.sleep(0.05)
        raise AssertionError({t: (self.reserved(t), self.open_reservations(t)) for t in teams})


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


@pytest.fixture
def prefix() -> Iterator[str]:
    p = random_prefix()
    yield p
    delete_prefix(p)


async def _post(
    client: httpx.AsyncClient, url: str, team: str, b: dict[str, Any]
) -> httpx.Response:
    return await client.post(
        url + "/v1/chat/completions", json=b, headers={"authorization": f"Bearer {key_of(team)}"}
    )


def test_two_replicas_400_concurrent_requests_never_overspend(
    upstream: str, prefix: str, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "router.yaml", upstream, prefix)
    ledger = Ledger(prefix)
    told = Told()
    with proxies([cfg, cfg], tmp_path) as (a, b):

        async def storm() -> list[tuple[str, httpx.Response]]:
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                jobs = [(TEAMS[i % 4], (a, b)[i % 2].url, i) for i in range(400)]
                answers = await asyncio.gather(
                    *(_post(client, url, team, body(team, i)) for team, url, i in jobs)
                )
            return [(team, ans) for (team, _, _), ans in zip(jobs, answers, strict=True)]

        results = asyncio.run(storm())
        ledger.wait_settled(TEAMS)
        for team, resp in results:
            told.response(team, resp)
            if resp.status_code != 200:
                assert resp.status_code == 429, resp.text
                assert resp.json()["error"]["code"] == "budget_exceeded"
                # A 'total' budget never resets: a Retry-After only when requests in flight
                # hold what this one needed (it may fit once they settle).
                if "retry-after" in resp.headers:
                    assert "in flight" in resp.json()["error"]["message"]
                    assert resp.headers["retry-after"] == "1"
        audit(prefix, told)  # spend <= limit, == ledger == told, nothing reserved
        for team in TEAMS:
            assert ledger.rebuilt_matches(team)
            ok = sum(1 for t, r in results if t == team and r.status_code == 200)
            # Even if all of a team's requests reserved at the same instant, this many fit.
            assert ok >= LIMIT_NANOS // worst_nanos(LARGE, body(team, 399)), (team, ok)
            assert len({e["rid"] for e in ledger.entries(team)}) == ok  # one charge per answer
        assert any(r.headers.get("x-router-downgraded") == "true" for _, r in results)
        for team in TEAMS:  # shown with `pytest -s`: the figures quoted in the report
            mine = [r for t, r in results if t == team]
            print(
                f"{team}: {sum(r.status_code == 200 for r in mine)} answered, "
                f"{sum(r.headers.get('x-router-downgraded') == 'true' for r in mine)} downgraded,"
                f" {sum(r.status_code == 429 for r in mine)} refused; spent "
                f"{ledger.spent(team)} of {LIMIT_NANOS} nanos"
            )

        # No leaked reservation: sequential requests keep fitting until the cheapest option's
        # worst case really no longer fits what is left.
        async def drain(team: str) -> None:
            async with httpx.AsyncClient(timeout=30) as client:
                for i in range(200):
                    resp = await _post(client, a.url, team, body(team, 1000 + i))
                    told.response(team, resp)
                    if resp.status_code == 429:
                        ledger.wait_settled([team])
                        left = LIMIT_NANOS - ledger.spent(team)
                        assert 0 <= left < worst_nanos(SMALL, body(team, 1000 + i))
                        return
                    assert resp.status_code == 200
                raise AssertionError("budget never ran out")

        for team in TEAMS:
            asyncio.run(drain(team))
        audit(prefix, told)


def test_killed_replica_reservations_are_reclaimed_within_the_lease(
    upstream: str, prefix: str, tmp_path: Path
) -> None:
    lease_s = 3.0
    cfg = write_config(
        tmp_path / "router.yaml", upstream, prefix, lease_s=lease_s, sweep_interval_s=0.5
    )
    ledger = Ledger(prefix)
    with proxies([cfg, cfg], tmp_path) as (victim, survivor):

        async def slow_requests() -> None:
            async with httpx.AsyncClient(timeout=30) as client:
                tasks = [
                    asyncio.create_task(
                        _post(client, victim.url, "t0", body("t0", i, echo={"delay_ms": 20_000}))
                    )
                    for i in range(10)
                ]
                deadline = time.monotonic() + 10
                while ledger.open_reservations("t0") < 20 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                victim.kill()  # SIGKILL mid-flight: no settle, no release
                await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(slow_requests())
        killed_at = time.monotonic()
        held = ledger.reserved("t0")
        assert held > 0 and ledger.open_reservations("t0") == 20
        while ledger.reserved("t0") > 0 and time.monotonic() - killed_at < lease_s + 5:
            time.sleep(0.05)
        reclaimed_after = time.monotonic() - killed_at
        assert ledger.reserved("t0") == 0 and ledger.open_reservations("t0") == 0
        assert reclaimed_after <= lease_s + 1.5, reclaimed_after
        print(
            f"10 reservations ({held} nanos) of the killed replica reclaimed "
            f"{reclaimed_after:.2f} s after SIGKILL (lease {lease_s} s)"
        )
        assert ledger.spent("t0") == 0  # the dead replica's requests were never charged
        # The whole budget is usable again from the surviving replica.
        ok = 0
        told = Told()  # the killed replica's clients got no answer, and were charged nothing
        with httpx.Client(timeout=30) as client:
            for i in range(20):
                r = client.post(
                    survivor.url + "/v1/chat/completions",
                    json=body("t0", 100 + i),
                    headers={"authorization": f"Bearer {key_of('t0')}"},
                )
                assert r.status_code == 200 and "x-router-downgraded" not in r.headers
                told.response("t0", r)
                ok += 1
        assert ok == 20
        audit(prefix, told)


def test_redis_outage_fail_closed_503_fail_open_journal_and_no_double_charge(
    upstream: str, prefix: str, tmp_path: Path
) -> None:
    with private_redis(tmp_path) as server:
        closed = write_config(
            tmp_path / "closed.yaml",
            upstream,
            prefix,
            server.url,
            redis_timeout_s=0.3,
            sweep_interval_s=0.5,
        )
        opened = write_config(
            tmp_path / "open.yaml",
            upstream,
            prefix,
            server.url,
            redis_timeout_s=0.3,
            sweep_interval_s=0.5,
            fail_mode="open",
            journal_path=str(tmp_path / "journal.jsonl"),
        )
        ledger = Ledger(prefix, server.url)
        with proxies([closed, opened], tmp_path) as (pc, po):
            told = 0
            told_by = Told()
            with httpx.Client(timeout=30) as client:

                def post(p: Any, i: int, **extra: Any) -> httpx.Response:
                    return client.post(
                        p.url + "/v1/chat/completions",
                        json=body("t1", i, **extra),
                        headers={"authorization": f"Bearer {key_of('t1')}"},
                    )

                for i in range(6):  # the last on the fail-open replica: it has seen the key
                    r = post(pc if i < 5 else po, i)
                    assert r.status_code == 200
                    told += usd_to_nanos(float(r.headers["x-router-cost-usd"]))
                    told_by.response("t1", r)
                ledger.wait_settled(["t1"])
                assert ledger.spent("t1") == told

                async def in_flight_when_redis_dies() -> list[httpx.Response]:
                    async with httpx.AsyncClient(timeout=30) as ac:
                        tasks = [
                            asyncio.create_task(
                                _post(ac, pc.url, "t1", body("t1", 50 + i, echo={"delay_ms": 1500}))
                            )
                            for i in range(4)
                        ]
                        deadline = time.monotonic() + 10
                        while ledger.open_reservations("t1") < 8:
                            assert time.monotonic() < deadline, "requests never reserved"
                            await asyncio.sleep(0.02)
                        server.kill()  # SIGKILL: only what AOF (fsync always) has survives
                        return list(await asyncio.gather(*tasks))

                slow = asyncio.run(in_flight_when_redis_dies())
                for r in slow:  # admitted before the outage: answered, settle is journaled
                    assert r.status_code == 200
                    told += usd_to_nanos(float(r.headers["x-router-cost-usd"]))
                    told_by.response("t1", r)

                r = post(pc, 60)
                assert r.status_code == 503
                assert r.json()["error"]["code"] == "budget_unavailable"
                r = post(po, 61)  # fail open: admitted, charged once Redis is back
                assert r.status_code == 200, r.text
                told += usd_to_nanos(float(r.headers["x-router-cost-usd"]))
                told_by.response("t1", r)

                server.start()  # same directory: the AOF is replayed
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and ledger.spent("t1") != told:
                    time.sleep(0.1)
                ledger.wait_settled(["t1"])
                assert ledger.spent("t1") == told == ledger.ledger_sum("t1")
                rids = [e["rid"] for e in ledger.entries("t1")]
                assert len(rids) == len(set(rids)) == 11  # nothing charged twice
                assert ledger.rebuilt_matches("t1")

                # A second hard restart loses no settled spend.
                server.kill()
                server.start()
                assert ledger.spent("t1") == told == ledger.ledger_sum("t1")
                r = post(pc, 70)
                assert r.status_code == 200
                told_by.response("t1", r)
                audit(prefix, told_by, server.url)


def test_stream_disconnect_settles_what_was_produced(
    upstream: str, prefix: str, tmp_path: Path
) -> None:
    trace = tmp_path / "traces" / "requests.jsonl"
    cfg = write_config(tmp_path / "router.yaml", upstream, prefix, traces=trace)
    ledger = Ledger(prefix)
    told = Told()
    with proxies([cfg], tmp_path) as (p,), httpx.Client(timeout=30) as client:
        full = body("t2", 1, stream=True, stream_options={"include_usage": True})
        with client.stream(
            "POST",
            p.url + "/v1/chat/completions",
            json=full,
            headers={"authorization": f"Bearer {key_of('t2')}"},
        ) as r:
            chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
            told.stream("t2", r, chunks)
        assert chunks[-1] == "data: [DONE]"
        ledger.wait_settled(["t2"])
        whole = ledger.spent("t2")
        assert whole == ACTUAL_LARGE_NANOS

        cut = body("t2", 2, stream=True, echo={"chunk_delay_ms": 300, "chunks": 8})
        with client.stream(
            "POST",
            p.url + "/v1/chat/completions",
            json=cut,
            headers={"authorization": f"Bearer {key_of('t2')}"},
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break  # hang up after the first chunk
            told.add("t2", r.headers["x-router-request-id"], None)  # it left before the cost
        ledger.wait_settled(["t2"])
        partial = ledger.spent("t2") - whole
        assert 0 < partial < ACTUAL_LARGE_NANOS  # the prompt and what was produced, not more
        assert len(ledger.entries("t2")) == 2
        audit(prefix, told, traces=[trace])  # the hang-up's charge is the one its trace shows
