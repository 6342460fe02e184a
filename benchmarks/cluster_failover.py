"""What a Redis Cluster master failover loses from the budget store, measured.

Starts a real local cluster (3 masters + 3 replicas, cluster-node-timeout 1000 ms, see
tests/support/redis_cluster.py), runs concurrent reserve -> settle traffic for teams spread over
all masters through `RedisClusterBudgetStore` (as a proxy replica does, maintenance task on, so
journaled settles are replayed), SIGKILLs the master holding one team's slot mid-run, lets its
replica take over, keeps the traffic going, then compares what the clients were told with what
the cluster kept:

- lost charges: settles Redis acknowledged (not journaled) whose ledger entry is gone,
- lost holds: reservations Redis acknowledged whose settle found no hold (ledger kind `direct`),
- zombie holds: reservations of settled requests that reappeared (their settle was lost; the
  hold is reclaimed when its lease runs out, lease_s after the reserve),
- spend <= limit per team (stored spend, and the sum of what the clients were told), and stored
  spend == sum of the ledger.

Run once without WAIT and once with `budgets.redis_wait_replicas: 1` (each on a fresh cluster),
with the replica in step (a plain SIGKILL) and with it 0.5 s behind its master:

    .venv/bin/python benchmarks/cluster_failover.py --concurrency 32 --seconds 8 --kill-at 3
    .venv/bin/python benchmarks/cluster_failover.py --lag-replica-s 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.cluster import key_slot

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support from a checkout

from policies.budgets.codec import TeamKeys  # noqa: E402
from policies.budgets.money import nanos_to_usd, usd_to_nanos  # noqa: E402
from policies.budgets.redis_cluster_store import RedisClusterBudgetStore  # noqa: E402
from policies.budgets.scopes import BudgetScope  # noqa: E402
from policies.budgets.store import BudgetExceeded, BudgetUnavailable  # noqa: E402
from policies.config import BudgetLimit, BudgetsConfig  # noqa: E402
from tests.support.redis_cluster import RunningCluster, running_cluster  # noqa: E402

RESERVE_USD = 0.01


@dataclass
class Tally:
    told: dict[str, int] = field(default_factory=dict)  # rid -> nanos the client was told
    team_of: dict[str, str] = field(default_factory=dict)  # rid -> team
    acked: set[str] = field(default_factory=set)  # settles Redis acknowledged
    deferred: set[str] = field(default_factory=set)  # settles journaled (Redis unreachable)
    refused_unavailable: int = 0
    refused_exceeded: int = 0
    reserved: int = 0
    latencies: list[float] = field(default_factory=list)


def pick_teams(cluster: RunningCluster, per_master: int) -> list[str]:
    by_master: dict[int, list[str]] = {}
    for i in range(10_000):
        name = f"team{i}"
        got = by_master.setdefault(cluster.master_of_slot(key_slot(name.encode())).port, [])
        if len(got) < per_master:
            got.append(name)
        if len(by_master) == 3 and all(len(v) == per_master for v in by_master.values()):
            return sorted(n for v in by_master.values() for n in v)
    raise RuntimeError("could not spread teams over the masters")


async def worker(
    store: RedisClusterBudgetStore,
    scopes: list[BudgetScope],
    tally: Tally,
    stop_at: float,
    rng: random.Random,
) -> None:
    while time.monotonic() < stop_at:
        scope = rng.choice(scopes)
        rid = uuid.uuid4().hex
        t0 = time.perf_counter()
        try:
            await store.reserve(scope, rid, RESERVE_USD, 100)
        except BudgetExceeded:
            tally.refused_exceeded += 1
            await asyncio.sleep(0.001)
            continue
        except BudgetUnavailable:
            tally.refused_unavailable += 1
            await asyncio.sleep(0.01)
            continue
        tally.reserved += 1
        await asyncio.sleep(rng.uniform(0, 0.005))  # the request runs
        actual = RESERVE_USD * rng.uniform(0.3, 1.0)
        out = await store.settle(rid, actual, 50)
        tally.latencies.append(time.perf_counter() - t0)
        tally.told[rid] = out.charged_nanos
        tally.team_of[rid] = scope.team
        (tally.deferred if out.deferred else tally.acked).add(rid)


def ballast(node: Any, team: str, megabytes: int) -> None:
    with node.client() as client:
        for i in range(megabytes):
            client.set(f"ballast:{{{team}}}:{i}", b"x" * 1_000_000)


def analyse(
    cluster: RunningCluster, prefix: str, teams: list[str], limit_usd: float, tally: Tally
) -> dict[str, Any]:
    client = cluster.client()
    ledger_rids: dict[str, tuple[str, int]] = {}
    over_limit = []
    audit_ok = True
    zombies = 0
    for team in teams:
        k = TeamKeys(prefix, team)
        entries = client.xrange(k.ledger)
        total = 0
        for _, f in entries:
            rid, nanos, kind = f[b"rid"].decode(), int(f[b"nanos"]), f[b"kind"].decode()
            ledger_rids[rid] = (kind, nanos)
            total += nanos
        spent = sum(int(v) for v in client.hgetall(k.spend).values())  # one scope, one period
        audit_ok &= spent == total
        if spent > usd_to_nanos(limit_usd):
            over_limit.append((team, nanos_to_usd(spent - usd_to_nanos(limit_usd))))
        zombies += sum(1 for rid in client.hkeys(k.res) if rid.decode() in tally.told)
    client.close()
    lost = [rid for rid in tally.acked if rid not in ledger_rids]
    told_by_team: dict[str, int] = {}
    for rid, nanos in tally.told.items():
        told_by_team[tally.team_of[rid]] = told_by_team.get(tally.team_of[rid], 0) + nanos
    told_over = [
        (t, nanos_to_usd(n - usd_to_nanos(limit_usd)))
        for t, n in sorted(told_by_team.items())
        if n > usd_to_nanos(limit_usd)
    ]
    lost_deferred = [rid for rid in tally.deferred if rid not in ledger_rids]
    direct = [rid for rid, (kind, _) in ledger_rids.items() if kind == "direct"]
    lat = sorted(tally.latencies)
    return {
        "reserved": tally.reserved,
        "settled_acked": len(tally.acked),
        "settled_journaled": len(tally.deferred),
        "refused_unavailable": tally.refused_unavailable,
        "refused_exceeded": tally.refused_exceeded,
        "lost_charges": len(lost),
        "lost_usd": round(nanos_to_usd(sum(tally.told[r] for r in lost)), 6),
        "lost_journaled": len(lost_deferred),
        "lost_holds": len(direct),
        "zombie_holds": zombies,
        "stored_over_limit": over_limit,
        "told_over_limit": told_over,  # what clients were charged, against the limit
        "spend_equals_ledger": audit_ok,
        "p50_ms": round(1000 * lat[len(lat) // 2], 2) if lat else None,
        "p99_ms": round(1000 * lat[int(len(lat) * 0.99)], 2) if lat else None,
    }


async def run_once(
    cluster: RunningCluster, wait_replicas: int, args: argparse.Namespace, teams: list[str]
) -> dict[str, Any]:
    prefix = "bench-" + uuid.uuid4().hex[:8]
    cfg = BudgetsConfig(
        store="redis-cluster",
        redis_url=cluster.url,
        key_prefix=prefix,
        redis_timeout_s=0.5,
        fail_mode="closed",
        sweep_interval_s=1,
        redis_wait_replicas=wait_replicas,
        redis_wait_timeout_ms=100,
    )
    store = RedisClusterBudgetStore(cfg)
    await store.start()
    limit = BudgetLimit(limit_usd=args.limit_usd, period="total")
    scopes = [BudgetScope(t, None, limit) for t in teams]
    tally = Tally()
    rng = random.Random(7)
    victim = cluster.master_of_slot(key_slot(teams[0].encode()))
    start = time.monotonic()
    stop_at = start + args.seconds
    workers = [
        asyncio.create_task(worker(store, scopes, tally, stop_at, random.Random(rng.random())))
        for _ in range(args.concurrency)
    ]
    replica = cluster.replica_of(victim)
    if args.lag_replica_s:
        await asyncio.sleep(args.kill_at - args.lag_replica_s)
        cluster.pause(replica)  # it falls behind: the master acknowledges what it has not got
        # Ballast on the victim (not money): fills the socket buffers towards the stopped
        # replica, so the charges after it wait in the master's own memory, where a SIGKILL
        # loses them, as on a slow or partitioned link.
        await asyncio.to_thread(ballast, victim, teams[0], args.ballast_mb)
        await asyncio.sleep(args.lag_replica_s)
    else:
        await asyncio.sleep(args.kill_at)
    cluster.kill(victim)
    killed_at = time.monotonic()
    if args.lag_replica_s:
        cluster.resume(replica)
    await asyncio.to_thread(cluster.wait_for_failover, 30.0)
    failover_s = time.monotonic() - killed_at
    if args.restart:  # as an orchestrator would: the old master comes back as a replica
        await asyncio.to_thread(cluster.restart, victim)
    await asyncio.gather(*workers)
    deadline = time.monotonic() + 20
    while store.journal.entries and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    unreplicated = store.unreplicated
    await store.aclose()
    out = analyse(cluster, prefix, teams, args.limit_usd, tally)
    out.update(
        {
            "wait_replicas": wait_replicas,
            "failover_s": round(failover_s, 2),
            "unreplicated_writes": unreplicated,
        }
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--kill-at", type=float, default=3.0)
    ap.add_argument("--limit-usd", type=float, default=5.0, help="per team, period total")
    ap.add_argument("--teams-per-master", type=int, default=2)
    ap.add_argument(
        "--lag-replica-s",
        type=float,
        default=0.0,
        help="SIGSTOP the victim's replica this long before the kill (a replica "
        "behind its master, as across a slow or partitioned link)",
    )
    ap.add_argument(
        "--ballast-mb",
        type=int,
        default=32,
        help="with --lag-replica-s: MB written to the victim while its replica is stopped",
    )
    ap.add_argument(
        "--no-restart",
        dest="restart",
        action="store_false",
        help="leave the killed master down (with --wait 1 its team then stays "
        "unavailable: its new master has no replica to confirm writes)",
    )
    ap.add_argument(
        "--wait",
        type=int,
        nargs="+",
        default=[0, 1],
        help="budgets.redis_wait_replicas values to run (one fresh cluster each)",
    )
    args = ap.parse_args()
    # The store logs every refused request and journaled charge of the outage; counted instead.
    logging.basicConfig(level=logging.CRITICAL)
    for wait in args.wait:
        with running_cluster(node_timeout_ms=1000) as cluster:
            teams = pick_teams(cluster, args.teams_per_master)
            result = asyncio.run(run_once(cluster, wait, args, teams))
        print(" ".join(f"{k}={v}" for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main()
