"""Acceptance with a misbehaving upstream: 400 concurrent requests through 2 proxy replicas for 4
teams, 20% of them answered with an injected fault (benchmarks/fault_upstream.py, every fault in
turn), on one Redis and on a 3-master Redis Cluster. Afterwards the budget audit invariant
(tests/support/audit.py) holds, every charge was told to its client, no request was charged past
its worst case or below zero, no answer is a 500 or cut, no upstream internals (traceback, host,
address, secret) reach a client, and a stream the upstream never finished ends with an error event.

The upstream keeps a prompt cache (exact, per model) and the tiers price cached input at 10% and
cache writes at 125% of input (issue 23), so the normal answers that reused a prefix are charged
the cached price, and each cached-token fault (more cached tokens than the prompt, a negative
count, details that are a string or a list) would be a credit if it were trusted: each must be a
fault, charged the router's own count at the fresh input price.

`pytest -s` prints the figures: per team the audit line, per fault the statuses seen and what its
requests were charged.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from redis.cluster import key_slot

from backends.config import Price
from benchmarks.fault_upstream import (
    CACHE_FAULTS,
    FAULTS,
    INTERNAL_HOST,
    INTERNAL_IP,
    SECRET,
    STREAM_ONLY,
    TRACEBACK_MARK,
    running_fault_upstream,
)
from policies.budgets.estimate import prompt_token_bound
from policies.budgets.factory import STORE_KINDS
from policies.config import BudgetLimit, BudgetsConfig
from policies.keys import hash_key
from tests.support.audit import Audit, Told, audit_budgets
from tests.support.budgets import REDIS_URL, delete_prefix, proxies, random_prefix
from tests.support.redis_cluster import RunningCluster

TEAMS = ["t0", "t1", "t2", "t3"]
LARGE = Price(
    input_per_mtok=100, output_per_mtok=1000, cached_input_per_mtok=10, cache_write_per_mtok=125
)
SMALL = Price(
    input_per_mtok=10, output_per_mtok=100, cached_input_per_mtok=1, cache_write_per_mtok=12.5
)
PRICES = {"small": SMALL, "large": LARGE}
# What each cached-token fault is counted as (cost_router_upstream_usage_faults_total's reason).
CACHE_FAULT_REASONS = {
    "cached_over_prompt": "cached_over_prompt",
    "negative_cached": "negative",
    "details_string": "malformed",
    "details_list": "malformed",
}
MAX_TOKENS = 8  # the fault upstream answers 8 completion tokens when it answers normally
ACTUAL_LARGE_NANOS = 5 * 100 * 1000 + MAX_TOKENS * 1000 * 1000  # a 5-word prompt, large tier
LIMIT_NANOS = 50 * ACTUAL_LARGE_NANOS  # each team's budget fits about 50 of its 100 requests
REQUESTS = 400
FAULT_EVERY = 5  # every 5th request: 20% faulted
TIER_TIMEOUT_S = 2  # `hang` and `stream_stall` sleep past it
HUGE_STREAM_MB = "2"  # per stream_huge_no_usage request: big enough to count, small enough for CI
LEAKS = (SECRET, INTERNAL_HOST, INTERNAL_IP, TRACEBACK_MARK)
TRUNCATED = ("stream_cut", "stream_stall", "stream_no_done")  # the upstream never finished


@dataclass(frozen=True, slots=True)
class Job:
    i: int
    team: str
    replica: int
    fault: str  # "none" for a normal answer
    stream: bool

    def body(self) -> dict[str, Any]:
        b: dict[str, Any] = {
            "model": "auto",
            "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": f"team {self.team} asks question {self.i}"}],
            "metadata": {"fault": self.fault, "fault_mb": HUGE_STREAM_MB},
        }
        if self.stream:
            b["stream"] = True
            b["stream_options"] = {"include_usage": True}
        return b


def jobs() -> list[Job]:
    """Request i: team i % 4, replica (i // 4) % 2 (every team on both), every 5th one faulted,
    cycling through every fault (stream-only faults on streams); a third of the rest stream.

    The faulted ones are sent first (all 400 are in flight together, so this only means they
    ask the budget before it runs out): each fault reaches the upstream, not just a 429."""
    out = []
    for i in range(REQUESTS):
        fault = FAULTS[(i // FAULT_EVERY) % len(FAULTS)] if i % FAULT_EVERY == 0 else "none"
        stream = fault in STREAM_ONLY or (i // FAULT_EVERY) % 3 == 0
        out.append(Job(i, TEAMS[i % 4], (i // 4) % 2, fault, stream))
    return sorted(out, key=lambda j: j.fault == "none")


def served_faults(upstream: str) -> Counter[str]:
    """How many answers of each fault the upstream has given so far (its /stats)."""
    stats = httpx.get(upstream.removesuffix("/v1") + "/stats", timeout=10).json()
    return Counter(stats["faults"])


def worst_nanos(b: dict[str, Any]) -> int:
    """The request's worst case on the large tier: what a settle may charge it at most."""
    return round(
        prompt_token_bound(b) * LARGE.worst_input_per_mtok * 1000
        + MAX_TOKENS * LARGE.output_per_mtok * 1000
    )


@dataclass(slots=True)
class Outcome:
    job: Job
    status: int | None = None  # None: the connection failed
    request_id: str | None = None
    text: str = ""  # the body, or the SSE lines joined
    error: str | None = None  # client-side exception, if any
    lines: list[str] = field(default_factory=list)

    def label(self) -> str:
        """The status, with the error code of a refusal or failure: `503 upstream_unavailable`."""
        if self.error is not None:
            return f"{self.status} {self.error}"
        if self.status in (200, None):
            return str(self.status)
        try:
            return f"{self.status} {orjson.loads(self.text)['error']['code']}"
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return f"{self.status} (no error code)"


async def send(client: httpx.AsyncClient, url: str, job: Job, told: Told) -> Outcome:
    out = Outcome(job)
    headers = {"authorization": f"Bearer sk-test-{job.team}"}
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=job.body(), headers=headers
        ) as resp:
            out.status, out.request_id = resp.status_code, resp.headers.get("x-router-request-id")
            try:
                if job.stream and resp.status_code == 200:
                    async for line in resp.aiter_lines():
                        out.lines.append(line)
                    told.stream(job.team, resp, out.lines)
                    out.text = "\n".join(out.lines)
                else:
                    out.text = (await resp.aread()).decode(errors="replace")
                    told.response(job.team, resp)
            except httpx.HTTPError as exc:  # cut mid-answer: the client was told nothing
                out.error = type(exc).__name__
                told.add(job.team, out.request_id, None)
    except httpx.HTTPError as exc:
        out.error = type(exc).__name__
    return out


def write_config(path: Path, upstream: str, store: dict[str, Any], trace: Path) -> Path:
    cfg = {
        "tiers": [
            {
                "name": "small",
                "base_url": upstream,
                "model": "echo-small",
                "price": SMALL.model_dump(),
                "max_inflight": 512,
                "timeout_s": TIER_TIMEOUT_S,
            },
            {
                "name": "large",
                "base_url": upstream,
                "model": "echo-large",
                "price": LARGE.model_dump(),
                "max_inflight": 512,
                "timeout_s": TIER_TIMEOUT_S,
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
        "keys": [{"key_sha256": hash_key(f"sk-test-{t}"), "team": t} for t in TEAMS],
        "auth": {"required": True},
        "budgets": store,
        "traces": {"path": str(trace)},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    # An exact prompt cache: a team's questions share 4 of their 5 words.
    with running_fault_upstream("--hang-s", str(4 * TIER_TIMEOUT_S), "--cache-block", "1") as url:
        yield url


@pytest.fixture(params=["redis", "cluster"])
def budgets_section(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The budgets section both replicas share: one Redis, or a 3-master cluster."""
    prefix = random_prefix()
    base = {"key_prefix": prefix, "redis_timeout_s": 5}
    if request.param == "redis":
        yield {"store": "redis", "redis_url": REDIS_URL, **base}
        delete_prefix(prefix)
        return
    if "redis-cluster" not in STORE_KINDS:
        pytest.skip(f"no redis-cluster budget store kind (STORE_KINDS: {sorted(STORE_KINDS)})")
    cluster: RunningCluster = request.getfixturevalue("redis_cluster")  # the session's cluster
    masters = {cluster.master_of_slot(key_slot(t.encode())).port for t in TEAMS}
    assert len(masters) == 3, masters  # the teams' slots live on every master
    yield {"store": "redis-cluster", "redis_url": cluster.url, **base}
    client = cluster.client()
    try:
        for key in list(client.scan_iter(match=f"{prefix}:*", count=1000)):
            client.delete(key)  # one by one: the keys of different teams live in different slots
    finally:
        client.close()


def leaks(text: str) -> list[str]:
    return [marker for marker in LEAKS if marker in text]


def looks_complete(o: Outcome) -> bool:
    """A 200 stream that reached the client with no error event: fine for a whole answer, a lie
    for one the upstream never finished (TRUNCATED)."""
    if not o.job.stream or o.status != 200 or o.error is not None:
        return False
    return not any(line.startswith("data: {") and '"error"' in line[:40] for line in o.lines)


def per_fault_report(outcomes: list[Outcome], audit: Audit) -> dict[str, dict[str, Any]]:
    """For each fault: statuses (and client errors) seen, nanos charged, requests charged past
    their worst case, and the markers of upstream internals that reached a client."""
    report: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "n": 0,
            "statuses": Counter(),
            "charged": 0,
            "over_worst": 0,
            "leaked": Counter(),
            "looks_complete": 0,
        }
    )
    for o in outcomes:
        r = report[o.job.fault]
        r["n"] += 1
        r["statuses"][o.label()] += 1
        entry = audit.charges.get(o.request_id or "")
        if entry is not None:
            r["charged"] += entry.nanos
            if entry.nanos > worst_nanos(o.job.body()) or entry.nanos < 0:
                r["over_worst"] += 1
        for marker in leaks(o.text):
            r["leaked"][marker] += 1
        if o.job.fault in TRUNCATED and looks_complete(o):
            r["looks_complete"] += 1
    return dict(report)


def cache_pricing_problems(outcomes: list[Outcome], audit: Audit, traces: list[Path]) -> list[str]:
    """Every charge is its trace's usage at its tier's price with its cached and written tokens
    (the cached price for what the upstream reused), and each cached-token fault is a fault
    charged as fresh input. Returns the problems and asserts the run was not hollow."""
    # The raw lines: `usage_fault` is written beside the schema's fields, not one of them.
    records = {
        r["id"]: r
        for path in traces
        if path.exists()
        for line in path.read_bytes().splitlines()
        if line.strip()
        for r in [orjson.loads(line)]
    }
    problems, cached_hits = [], 0
    for o in outcomes:
        record = records.get(o.request_id or "")
        entry = audit.charges.get(o.request_id or "")
        if record is None or entry is None or record.get("tier") is None:
            continue  # refused or failed: nothing charged (the audit covers the money)
        cached = record.get("cached_tokens") or 0
        cached_hits += o.job.fault == "none" and cached > 0
        expected = PRICES[record["tier"]].cost_nanos(
            record.get("prompt_tokens") or 0,
            record.get("completion_tokens") or 0,
            cached,
            record.get("cache_write_tokens") or 0,
        )
        if entry.nanos != min(expected, worst_nanos(o.job.body())):
            problems.append(
                f"request {o.job.i} ({o.job.fault}): charged {entry.nanos}, its usage at "
                f"its price is {expected}"
            )
        fault = record.get("usage_fault")
        if o.job.fault in CACHE_FAULTS and (fault != CACHE_FAULT_REASONS[o.job.fault] or cached):
            problems.append(
                f"request {o.job.i} ({o.job.fault}): fault {fault!r}, "
                f"{cached} cached tokens charged (want a fault, none cached)"
            )
    assert cached_hits > 0, "no normal answer reused a cached prefix: a hollow run"
    return problems


def test_400_concurrent_requests_with_20pct_upstream_faults_keep_the_audit_invariant(
    upstream: str, budgets_section: dict[str, Any], tmp_path: Path
) -> None:
    traces = [tmp_path / f"traces{r}" / "requests.jsonl" for r in (0, 1)]
    cfgs = [
        write_config(tmp_path / f"router{r}.yaml", upstream, budgets_section, traces[r])
        for r in (0, 1)
    ]
    told = Told()
    before = served_faults(upstream)
    with proxies(cfgs, tmp_path) as replicas:

        async def storm() -> list[Outcome]:
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                return list(
                    await asyncio.gather(
                        *(send(client, replicas[j.replica].url, j, told) for j in jobs())
                    )
                )

        t0 = time.perf_counter()
        outcomes = asyncio.run(storm())
        storm_s = time.perf_counter() - t0
        limits = {t: BudgetLimit(limit_usd=LIMIT_NANOS / 1e9, period="total") for t in TEAMS}
        audit = audit_budgets(BudgetsConfig(**budgets_section), limits, told, traces)

    faults = per_fault_report(outcomes, audit)
    served = served_faults(upstream) - before
    print(
        f"\n{REQUESTS} requests in {storm_s:.1f} s; "
        f"{sum(j.fault != 'none' for j in jobs())} of them faulted; "
        f"{len(told.untold())} answers told no cost; {told.anonymous} without a request id;"
        f" the upstream served {dict(served)}"
    )
    print(audit.figures())
    for name, r in sorted(faults.items()):
        print(
            f"{name:22s} n={r['n']:3d} statuses={dict(r['statuses'])} charged={r['charged']} "
            f"over_worst_case={r['over_worst']} leaked={dict(r['leaked'])} "
            f"truncated_but_looks_complete={r['looks_complete']}"
        )

    problems = audit.breaches()
    # No client hangs up here, so every charge was told (the final usage chunk of a stream that
    # failed mid-way included), not merely recorded in a trace.
    problems += [
        f"{a.team}: {a.untold_trace_nanos} nanos charged to requests whose client was told no cost"
        for a in audit.teams
        if a.untold_trace_nanos
    ]
    problems += [
        f"{name}: {r['over_worst']} requests charged past their worst case"
        for name, r in faults.items()
        if r["over_worst"]
    ]
    problems += [
        f"{name}: {dict(r['leaked'])} reached clients" for name, r in faults.items() if r["leaked"]
    ]
    problems += [
        f"{name}: {r['looks_complete']} truncated streams reached the client with no error event"
        for name, r in faults.items()
        if r["looks_complete"]
    ]
    problems += [
        f"request {o.job.i} ({o.job.fault}): status {o.status}"
        for o in outcomes
        if o.status is None or o.status >= 500 and o.status not in (502, 503, 504)
    ]
    problems += [
        f"request {o.job.i} ({o.job.fault}): client saw {o.error}"
        for o in outcomes
        if o.error is not None
    ]
    problems += [
        f"request {o.job.i} ({o.job.fault}): {o.label()}"
        for o in outcomes
        if "budget_unavailable" in o.label()
    ]  # the store failed
    problems += cache_pricing_problems(outcomes, audit, traces)
    ok = Counter(o.job.team for o in outcomes if o.status == 200 and o.job.fault == "none")
    assert all(ok[t] > 0 for t in TEAMS), ok  # the budget did admit work: not a hollow run
    assert all(served[f] > 0 for f in FAULTS), served  # every fault did reach the proxy
    assert not problems, "\n".join(problems) + "\nfigures:\n" + audit.figures()
