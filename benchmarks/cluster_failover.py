"""What a Redis Cluster master failover does to the budget store, measured, run after run.

Each run starts a fresh local cluster (3 masters + 3 replicas, cluster-node-timeout 1000 ms, see
tests/support/redis_cluster.py), runs concurrent reserve -> settle traffic for teams spread over
all masters through `RedisClusterBudgetStore` on uvloop (as a proxy replica does: `serve` runs
on uvloop, and the maintenance task is on, so journaled settles are replayed and leases renewed),
SIGKILLs the master holding one team's slot mid-burst, lets its replica take over (the old master
restarted as a replica, as an orchestrator would), keeps the traffic going, then compares what
the clients were told with what the cluster kept. Per run:

- settles_lost: settles Redis acknowledged (not journaled) whose ledger entry is gone,
- told_not_charged_usd: what clients were told they were charged that is in no ledger entry
  (acknowledged or journaled, after the journal drained),
- held_past_lease: reservations still held (in Redis, or in the replica's renewed set) lease_s
  plus two sweeps after the burst and the journal replay ended (every request had settled),
- errors_5xx: reserve or settle calls that raised anything but BudgetExceeded or
  BudgetUnavailable (what the proxy answers 500 to, or logs as a failed settle),
- untouched_affected: teams whose master was never killed with any of: a refusal as
  unavailable, an error, a lost settle, money told but not charged, a hold past its lease, a
  settle journaled, a refusal as exceeded that its own traffic does not explain, or fewer
  requests served than the others (rules below),
- lost_holds / holds_back, spend == ledger, spend <= limit, as before;
- per_team: attempts, served, refusals (exceeded; of those unowed; unavailable), journaled
  settles and the mean reserve latency before the kill, during the failover and after; the
  topology (who replicates whom) before the kill, after the failover, after the restart.

How "affected" is decided for a team of a master that stayed up, so that a store which treats
it as if no failover happened counts 0 and the effect issue 24 found (a team served 52 requests
where every other team got 66: holds of its failed settles renewed, 24% of its limit) counts:

- Every worker asks every team once per round, in a fresh random order, so all teams get the
  same number of attempts to one per worker. (Uniform draws, as before, gave one team of a
  master that stayed up 14% fewer attempts than another in every run, from the one fixed
  seed: served 619 vs 741 in the WAIT runs, where the limit did not bind. Nothing was refused:
  served == attempts, reserve latency equal, and the topology showed no replica migration.)
- The first team on each master has a limit it reaches (`--limit-usd`); the others one they
  never reach (`--open-limit-usd`), so they ask for budget all through the failover. (With
  every team capped, on an idle machine the teams reached their limit before the kill and
  nothing could show.)
- A refusal as exceeded is owed when what the team's clients can have in the store (the
  charges of the settles returned, a reservation for each settle returned during the call and
  for each request still in flight) plus the amount asked is over its limit (`owed_refusal`);
  any other is a hold or spend the team no longer has, counted.
- Served at least `served_floor`: the median of the untouched teams of the same limit, less one
  per worker (the rounds) and four times the spread of how many requests fit in a limit
  (COST_CV * sqrt(n)). A backstop: what lowers a count is already a refusal above.

Targets: errors_5xx 0, held_past_lease 0, untouched_affected 0, and with
`budgets.redis_wait_replicas: 1` settles_lost 0. Ten runs each without and with WAIT:

    .venv/bin/python benchmarks/cluster_failover.py --runs 10 --wait 0 1
    .venv/bin/python benchmarks/cluster_failover.py --runs 3 --lag-replica-s 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
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
class TeamTally:
    limit_nanos: int
    attempts: int = 0
    reserved: int = 0
    served: int = 0  # settled: the request ran and its client was told its cost
    journaled: int = 0  # of those, settles the store journaled (its master did not confirm)
    refused_unavailable: int = 0
    refused_exceeded: int = 0
    # Refusals as exceeded that the team's own traffic does not explain (`owed_refusal`).
    refused_unowed: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # "reserve: RuntimeError" -> count
    # What the team may have in the store, as its clients know it: charges of the settles
    # that returned, the number of those, and the reservations asked for and not yet settled
    # or refused (at RESERVE_USD each).
    charged_nanos: int = 0
    settled_n: int = 0
    in_flight_nanos: int = 0
    # Reserve latency by phase of the run (before the kill, until the failover healed, after).
    reserve_s: Counter[str] = field(default_factory=Counter)
    reserve_n: Counter[str] = field(default_factory=Counter)


@dataclass
class Tally:
    told: dict[str, int] = field(default_factory=dict)  # rid -> nanos the client was told
    team_of: dict[str, str] = field(default_factory=dict)  # rid -> team
    acked: set[str] = field(default_factory=set)  # settles Redis acknowledged
    deferred: set[str] = field(default_factory=set)  # settles journaled (Redis unreachable)
    teams: dict[str, TeamTally] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    killed_at: float = float("inf")
    healed_at: float = float("inf")

    def phase(self, now: float) -> str:
        return "before" if now < self.killed_at else "failover" if now < self.healed_at else "after"


def owed_refusal(team: TeamTally, charged0: int, settled_n0: int) -> bool:
    """Whether a refusal as exceeded is owed to the team's own traffic: what its clients can
    have in the store when the reserve script ran, plus the amount asked, is over the limit.

    That is at most: the charges of the settles that had returned when this reserve was sent
    (`charged0`, `settled_n0`: their holds are gone), a whole RESERVE_USD for each settle that
    returned since (its hold may still have been there), and RESERVE_USD for each reservation
    still in flight now (other than this one). A store that refuses below that bound counts
    budget the team no longer uses (a hold left after its settle, as in issue 24: a settle that
    failed and a hold renewed for as long as the replica ran)."""
    reserve = usd_to_nanos(RESERVE_USD)
    bound = charged0 + (team.settled_n - settled_n0) * reserve + team.in_flight_nanos
    return bound + reserve > team.limit_nanos


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


def team_limits(
    cluster: RunningCluster, teams: list[str], capped_usd: float, open_usd: float
) -> dict[str, float]:
    """The first team (by name) on each master gets `capped_usd`, which it reaches in the
    burst (spend <= limit is checked where it binds); the others `open_usd`, which they never
    reach, so they ask for budget all through the failover and any refusal shows."""
    by_master: dict[int, list[str]] = {}
    for team in teams:
        by_master.setdefault(cluster.master_of_slot(key_slot(team.encode())).port, []).append(team)
    return {
        team: capped_usd if i == 0 else open_usd
        for names in by_master.values()
        for i, team in enumerate(sorted(names))
    }


async def worker(
    store: RedisClusterBudgetStore,
    scopes: list[BudgetScope],
    tally: Tally,
    stop_at: float,
    rng: random.Random,
) -> None:
    reserve = usd_to_nanos(RESERVE_USD)
    order: list[BudgetScope] = []
    while time.monotonic() < stop_at:
        # Every team once per round, in a fresh random order: each team gets the same number
        # of attempts (to one per worker), so a team served less than the others was refused
        # more, not asked less often (uniform draws from one fixed seed gave one team 14% fewer
        # attempts than another, in every run).
        if not order:
            order = rng.sample(scopes, len(scopes))
        scope = order.pop()
        team = tally.teams[scope.team]
        rid = uuid.uuid4().hex
        t0 = time.perf_counter()
        team.attempts += 1
        charged0, settled_n0 = team.charged_nanos, team.settled_n
        team.in_flight_nanos += reserve
        outcome: BaseException | None = None
        try:
            await store.reserve(scope, rid, RESERVE_USD, 100)
        except Exception as exc:  # noqa: BLE001 - every outcome is counted below
            outcome = exc
        team.reserve_s[tally.phase(time.monotonic())] += time.perf_counter() - t0
        team.reserve_n[tally.phase(time.monotonic())] += 1
        if outcome is not None:
            team.in_flight_nanos -= reserve
            if isinstance(outcome, BudgetExceeded):
                team.refused_exceeded += 1
                if not owed_refusal(team, charged0, settled_n0):
                    team.refused_unowed += 1
                await asyncio.sleep(0.001)
            elif isinstance(outcome, BudgetUnavailable):
                team.refused_unavailable += 1
                await asyncio.sleep(0.01)
            else:  # the proxy's 500: counted, the burst goes on
                team.errors[f"reserve: {type(outcome).__name__}"] += 1
                await asyncio.sleep(0.01)
            continue
        team.reserved += 1
        await asyncio.sleep(rng.uniform(0, 0.005))  # the request runs
        actual = RESERVE_USD * rng.uniform(0.3, 1.0)
        # The proxy settles after the answer: the client has been told this (below the cap).
        tally.told[rid] = usd_to_nanos(actual)
        tally.team_of[rid] = scope.team
        team.served += 1
        try:
            out = await store.settle(rid, actual, 50)
        except Exception as exc:  # noqa: BLE001 - the proxy logs "budget settle failed"
            team.errors[f"settle: {type(exc).__name__}"] += 1
            continue  # counted as in flight from now on: its hold may be left in the store
        team.settled_n += 1
        team.in_flight_nanos -= reserve
        team.charged_nanos += out.charged_nanos
        tally.latencies.append(time.perf_counter() - t0)
        tally.told[rid] = out.charged_nanos
        team.journaled += out.deferred
        (tally.deferred if out.deferred else tally.acked).add(rid)


def ballast(node: Any, team: str, megabytes: int) -> None:
    with node.client() as client:
        for i in range(megabytes):
            client.set(f"ballast:{{{team}}}:{i}", b"x" * 1_000_000)


def set_full_coverage(cluster: RunningCluster, required: bool) -> None:
    """cluster-require-full-coverage on every live node. `yes` (Redis's default) makes every
    master refuse every key (CLUSTERDOWN) from the moment a master is marked failed until its
    replica is elected; `no` keeps the masters that stay up serving their slots."""
    for node in cluster.nodes:
        if node.role != "dead":
            with node.client() as client:
                client.config_set("cluster-require-full-coverage", "yes" if required else "no")


def topology(cluster: RunningCluster) -> dict[int, str]:
    """Each live node's role as the cluster sees it: port -> "master" or "replica of PORT"."""
    node = next(n for n in cluster.nodes if n.role != "dead")
    with node.client() as client:
        text = client.execute_command("CLUSTER", "NODES")
    lines = (text.decode() if isinstance(text, bytes) else str(text)).splitlines()
    port_of: dict[str, int] = {}
    rows: list[list[str]] = []
    for line in lines:
        f = line.split()
        port_of[f[0]] = int(f[1].split("@")[0].rsplit(":", 1)[1])
        rows.append(f)
    out: dict[int, str] = {}
    for f in rows:
        port = port_of[f[0]]
        if "fail" in f[2].split(","):
            out[port] = "failed"
        elif f[3] != "-":
            out[port] = f"replica of {port_of.get(f[3], f[3])}"
        else:
            out[port] = "master"
    return dict(sorted(out.items()))


def holds(cluster: RunningCluster, prefix: str, teams: list[str]) -> dict[str, int]:
    """Reservations each team's keys still hold, read raw (no script: nothing reclaimed here);
    nanos held without a reservation record count as one."""
    with cluster.client() as client:
        out = {}
        for team in teams:
            k = TeamKeys(prefix, team)
            reserved = sum(int(v) for v in client.hgetall(k.reserved).values())
            out[team] = max(int(client.hlen(k.res)), 1 if reserved else 0)
        return out


# Coefficient of variation of a request's cost (uniform in 0.3-1.0 of RESERVE_USD).
COST_CV = (0.7 / 12**0.5) / 0.65


def served_floor(served: list[int], concurrency: int) -> float:
    """The fewest requests a team whose master stayed up may be served without counting as
    affected: the median of those teams, less what their served counts differ by with a
    store that treats them alike. The rounds give every team the same number of attempts to
    one per worker (`concurrency`); and where a team reaches its limit, how many requests fit
    varies with their random costs by COST_CV * sqrt(n), allowed four times over."""
    if not served:
        return 0.0
    median = statistics.median(served)
    return median - concurrency - 4 * COST_CV * median**0.5


def analyse(
    cluster: RunningCluster,
    prefix: str,
    teams: list[str],
    victims: set[str],
    tally: Tally,
    held: dict[str, int],
    concurrency: int,
) -> dict[str, Any]:
    client = cluster.client()
    ledger_rids: dict[str, tuple[str, int]] = {}
    over_limit = []
    audit_ok = True
    for team in teams:
        k = TeamKeys(prefix, team)
        total = 0
        for _, f in client.xrange(k.ledger):
            rid, nanos, kind = f[b"rid"].decode(), int(f[b"nanos"]), f[b"kind"].decode()
            ledger_rids[rid] = (kind, nanos)
            total += nanos
        spent = sum(int(v) for v in client.hgetall(k.spend).values())  # one scope, one period
        audit_ok &= spent == total
        cap = tally.teams[team].limit_nanos
        if spent > cap:
            over_limit.append((team, nanos_to_usd(spent - cap)))
    client.close()
    lost = [rid for rid in tally.acked if rid not in ledger_rids]
    uncharged = [rid for rid in tally.told if rid not in ledger_rids]
    told_by_team = Counter[str]()
    for rid, nanos in tally.told.items():
        told_by_team[tally.team_of[rid]] += nanos
    told_over = [
        (t, nanos_to_usd(n - tally.teams[t].limit_nanos))
        for t, n in sorted(told_by_team.items())
        if n > tally.teams[t].limit_nanos
    ]
    direct = [rid for rid, (kind, _) in ledger_rids.items() if kind == "direct"]
    untouched = sorted(set(teams) - victims)
    # Served counts compare among teams of one limit (the capped ones all stop at it).
    floors = {
        cap: served_floor(
            [tally.teams[t].served for t in untouched if tally.teams[t].limit_nanos == cap],
            concurrency,
        )
        for cap in {tally.teams[t].limit_nanos for t in untouched}
    }
    affected: dict[str, list[str]] = {}
    for team in untouched:
        t = tally.teams[team]
        floor = floors[t.limit_nanos]
        why = [f"{n} {what}" for what, n in t.errors.items()]
        if t.refused_unavailable:
            why.append(f"{t.refused_unavailable} refused unavailable")
        if t.refused_unowed:
            why.append(f"{t.refused_unowed} refused as exceeded below its limit")
        if t.journaled:
            why.append(f"{t.journaled} settles journaled")
        if t.served < floor:
            why.append(f"served {t.served}, under {floor:.0f}")
        n_lost = sum(1 for rid in uncharged if tally.team_of[rid] == team)
        if n_lost:
            why.append(f"{n_lost} told not charged")
        if held[team]:
            why.append(f"{held[team]} held past lease")
        if why:
            affected[team] = why
    errors = Counter[str]()
    for t in tally.teams.values():
        errors.update(t.errors)
    lat = sorted(tally.latencies)
    return {
        "reserved": sum(t.reserved for t in tally.teams.values()),
        "settled_acked": len(tally.acked),
        "settled_journaled": len(tally.deferred),
        "refused_unavailable_victim": sum(tally.teams[t].refused_unavailable for t in victims),
        "refused_unavailable_untouched": sum(
            tally.teams[t].refused_unavailable for t in set(teams) - victims
        ),
        "settles_lost": len(lost),
        "lost_usd": round(nanos_to_usd(sum(tally.told[r] for r in lost)), 6),
        "told_not_charged_usd": round(nanos_to_usd(sum(tally.told[r] for r in uncharged)), 6),
        "held_past_lease": sum(held.values()),
        "errors_5xx": sum(errors.values()),
        "error_kinds": dict(errors),
        "untouched_affected": len(affected),
        "untouched_why": affected,
        "served": {t: tally.teams[t].served for t in teams},
        "lost_holds": len(direct),
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
        redis_timeout_s=args.redis_timeout_s,
        fail_mode="closed",
        lease_s=args.lease_s,
        sweep_interval_s=args.sweep_interval_s,
        redis_wait_replicas=wait_replicas,
        redis_wait_timeout_ms=100,
    )
    store = RedisClusterBudgetStore(cfg)
    await store.start()
    limits = team_limits(cluster, teams, args.limit_usd, args.open_limit_usd)
    scopes = [BudgetScope(t, None, BudgetLimit(limit_usd=limits[t], period="total")) for t in teams]
    tally = Tally(teams={t: TeamTally(usd_to_nanos(limits[t])) for t in teams})
    rng = random.Random(args.seed)
    victim = cluster.master_of_slot(key_slot(teams[0].encode()))
    master_of = {t: cluster.master_of_slot(key_slot(t.encode())).port for t in teams}
    victims = {t for t in teams if cluster.master_of_slot(key_slot(t.encode())) is victim}
    start = time.monotonic()
    topo = {"before": await asyncio.to_thread(topology, cluster)}
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
    killed_at = tally.killed_at = time.monotonic()
    if args.lag_replica_s:
        cluster.resume(replica)
    await asyncio.to_thread(cluster.wait_for_failover, 30.0)
    tally.healed_at = time.monotonic()
    failover_s = tally.healed_at - killed_at
    topo["failed_over"] = await asyncio.to_thread(topology, cluster)
    if args.restart:  # as an orchestrator would: the old master comes back as a replica
        await asyncio.to_thread(cluster.restart, victim)
        await asyncio.to_thread(set_full_coverage, cluster, args.full_coverage == "yes")
        topo["restarted"] = await asyncio.to_thread(topology, cluster)
    await asyncio.gather(*workers)
    topo["burst_end"] = await asyncio.to_thread(topology, cluster)
    burst_end = time.monotonic()
    deadline = burst_end + 20
    while store.journal.entries and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    drained_s = time.monotonic() - burst_end
    # Every request has settled: with the replica still running (renewing what it holds), no
    # reservation may be left once a lease and two sweeps have passed.
    check_at = time.monotonic() + args.lease_s + 2 * args.sweep_interval_s + 1
    if args.hold_check_s is not None:
        check_at = burst_end + args.hold_check_s
    await asyncio.sleep(max(0.0, check_at - time.monotonic()))
    held = await asyncio.to_thread(holds, cluster, prefix, teams)
    renewing = Counter(res.team for res in store._local.values())  # what it would still renew
    for team, n in renewing.items():
        held[team] = max(held[team], n)
    renewed_set = sum(renewing.values())
    unreplicated = store.unreplicated
    journal_left = len(store.journal.entries)
    await store.aclose()
    out = analyse(cluster, prefix, teams, victims, tally, held, args.concurrency)
    out.update(
        {
            "wait_replicas": wait_replicas,
            "full_coverage": args.full_coverage,
            "failover_s": round(failover_s, 2),
            "journal_drained_s": round(drained_s, 2),
            "journal_left": journal_left,
            "renewed_set_left": renewed_set,
            "hold_check_after_burst_s": round(check_at - burst_end, 1),
            "unreplicated_writes": unreplicated,
            "killed": victim.port,
            "master_of": master_of,
            "topology": topo,
            "per_team": {
                t: {
                    "attempts": x.attempts,
                    "served": x.served,
                    "exceeded": x.refused_exceeded,
                    "unowed": x.refused_unowed,
                    "unavailable": x.refused_unavailable,
                    "journaled": x.journaled,
                    "reserve_ms": {
                        ph: round(1000 * x.reserve_s[ph] / x.reserve_n[ph], 1)
                        for ph in ("before", "failover", "after")
                        if x.reserve_n[ph]
                    },
                }
                for t, x in tally.teams.items()
            },
        }
    )
    return out


SUMMED = (
    "settles_lost",
    "told_not_charged_usd",
    "held_past_lease",
    "errors_5xx",
    "untouched_affected",
    "refused_unavailable_untouched",
)


def loop_runner(name: str) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    if name == "uvloop":
        import uvloop  # only for this choice: the benchmark also runs on asyncio's own loop

        return uvloop.run
    return asyncio.run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1, help="runs per --wait value, each fresh")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--kill-at", type=float, default=3.0)
    ap.add_argument(
        "--limit-usd",
        type=float,
        default=5.0,
        help="limit (period total) of the first team on each master: reached in the burst",
    )
    ap.add_argument(
        "--open-limit-usd",
        type=float,
        default=1000.0,
        help="limit of the other teams: never reached, so they ask for budget throughout",
    )
    ap.add_argument("--teams-per-master", type=int, default=2)
    ap.add_argument("--lease-s", type=float, default=6.0, help="budgets.lease_s")
    ap.add_argument("--redis-timeout-s", type=float, default=0.5, help="budgets.redis_timeout_s")
    ap.add_argument("--sweep-interval-s", type=float, default=1.0)
    ap.add_argument(
        "--hold-check-s",
        type=float,
        default=None,
        help="count holds this long after the burst (default: a lease and two sweeps after "
        "the journal drained)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--full-coverage",
        choices=("yes", "no"),
        default="no",
        help="cluster-require-full-coverage of the nodes (yes: every team is refused while a "
        "master is failed and not yet replaced; docs/budgets.md)",
    )
    ap.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="event loop (serve runs on uvloop, where a closed transport raises RuntimeError)",
    )
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
        help="budgets.redis_wait_replicas values to run (one fresh cluster each run)",
    )
    return ap.parse_args(argv)


def run_fresh(wait: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run on a fresh cluster (what tests/policies/budgets/test_cluster.py runs too)."""
    with running_cluster(node_timeout_ms=1000) as cluster:
        set_full_coverage(cluster, args.full_coverage == "yes")
        teams = pick_teams(cluster, args.teams_per_master)
        result: dict[str, Any] = loop_runner(args.loop)(run_once(cluster, wait, args, teams))
    return result


def main() -> None:
    args = parse_args()
    # The store logs every refused request and journaled charge of the outage; counted instead.
    logging.basicConfig(level=logging.CRITICAL)
    totals: dict[int, Counter[str]] = {}
    for wait in args.wait:
        total = totals.setdefault(wait, Counter())
        for i in range(args.runs):
            result = run_fresh(wait, args)
            print(f"run={i + 1} " + " ".join(f"{k}={v}" for k, v in result.items()), flush=True)
            for key in SUMMED:
                total[key] += result[key]
            total["runs"] += 1
            total["runs_with_5xx"] += bool(result["errors_5xx"])
            total["runs_untouched_affected"] += bool(result["untouched_affected"])
    for wait, total in totals.items():
        summary = {k: round(v, 6) if isinstance(v, float) else v for k, v in total.items()}
        print(
            f"TOTAL wait_replicas={wait} loop={args.loop} full_coverage={args.full_coverage} "
            + " ".join(f"{k}={v}" for k, v in summary.items())
        )


if __name__ == "__main__":
    main()
