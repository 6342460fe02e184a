"""Finding 4 of issue 12: budgets and keys on a real Redis Cluster (3 masters, 3 replicas).

The proxy runs as a subprocess (`cost-router serve`) with `budgets.store: redis-cluster`; teams
are picked so their slots live on different masters. The failover tests start their own cluster,
SIGKILL the master of one team's slot and wait for its replica to take over (issue 24: one of
them drives the store in a burst, through benchmarks/cluster_failover.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from redis.cluster import key_slot
from typer.testing import CliRunner

from benchmarks import cluster_failover as failover_bench
from benchmarks.echo_upstream import running_echo_upstream
from policies.budgets.factory import build_stores
from policies.budgets.money import usd_to_nanos
from policies.budgets.scopes import BudgetScope
from policies.budgets.store import BudgetUnavailable
from policies.config import AuthConfig, BudgetLimit, BudgetsConfig
from policies.keys import AuthError, KeyRecord, KeyRing, hash_key
from router.cli import app as cli_app
from tests.support.budgets import REDIS_URL, delete_prefix, proxies, random_prefix
from tests.support.redis_cluster import RunningCluster, running_cluster
from tests.support.waiting import wait_for


def teams_on_every_master(cluster: RunningCluster) -> list[str]:
    """One team name per master: the hash tag {team} puts all of a team's keys in one slot."""
    chosen: dict[int, str] = {}
    for i in range(1000):
        name = f"team{i}"
        chosen.setdefault(cluster.master_of_slot(key_slot(name.encode())).port, name)
        if len(chosen) == len(cluster.masters()):
            return sorted(chosen.values())
    raise AssertionError("no team names cover every master")


def key_of(team: str) -> str:
    return f"sk-test-{team}"


def write_config(
    path: Path, upstream: str, url: str, prefix: str, teams: list[str], **budgets: Any
) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "tiers": [
                    {
                        "name": "small",
                        "base_url": upstream,
                        "model": "echo",
                        "price": {"input_per_mtok": 100, "output_per_mtok": 1000},
                    }
                ],
                "teams": {t: {"budget": {"limit_usd": 10.0, "period": "daily"}} for t in teams},
                "keys": [{"key_sha256": hash_key(key_of(t)), "team": t} for t in teams],
                "auth": {"required": True},
                "budgets": {
                    "store": "redis-cluster",
                    "redis_url": url,
                    "key_prefix": prefix,
                    "key_cache_s": 0,
                    "redis_timeout_s": 2,
                    **budgets,
                },
                "traces": {"path": str(path.parent / "traces.jsonl")},
            }
        )
    )
    return path


def chat(url: str, key: str) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        timeout=30,
        headers={"authorization": f"Bearer {key}"},
        json={
            "model": "auto",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hello cluster"}],
        },
    )


def cli(*args: str) -> Any:
    return CliRunner().invoke(cli_app, list(args), env={"COST_ROUTER_CONFIG": None})


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with running_echo_upstream() as url:
        yield url


def test_every_team_works_whatever_master_holds_its_slot_and_keys_live_on_the_cluster(
    redis_cluster: RunningCluster,
    upstream: str,
    tmp_path: Path,
) -> None:
    teams = teams_on_every_master(redis_cluster)
    prefix = random_prefix()
    path = write_config(tmp_path / "router.yaml", upstream, redis_cluster.url, prefix, teams)
    assert cli("config", "check", str(path)).exit_code == 0

    created = cli("keys", "create", "--team", teams[1], "--config", str(path))
    assert created.exit_code == 0, created.output
    runtime_key = created.stdout.strip().splitlines()[0]
    told: dict[str, int] = dict.fromkeys(teams, 0)
    with proxies([path], tmp_path) as (proxy,):
        ready = httpx.get(proxy.url + "/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"]["budgets"]["detail"] == "redis-cluster"
        for _ in range(3):
            for team in teams:  # before the fix: 500 (MovedError) for teams on other masters
                r = chat(proxy.url, key_of(team))
                assert r.status_code == 200, r.text
                told[team] += usd_to_nanos(float(r.headers["x-router-cost-usd"]))
        r = chat(proxy.url, runtime_key)
        assert r.status_code == 200, r.text
        told[teams[1]] += usd_to_nanos(float(r.headers["x-router-cost-usd"]))

        listed = [
            json.loads(line)
            for line in cli("keys", "list", "--json", "--config", str(path)).stdout.splitlines()
        ]
        runtime = [k for k in listed if k["source"] == "runtime"]
        assert [k["team"] for k in runtime] == [teams[1]]
        revoked = cli("keys", "revoke", runtime[0]["key_id"], "--config", str(path))
        assert revoked.exit_code == 0, revoked.output
        assert chat(proxy.url, runtime_key).json()["error"]["code"] == "revoked_api_key"

    shown = cli("budget", "show", "--json", "--config", str(path))
    assert shown.exit_code == 0, shown.output
    spent = {row["team"]: row["spent_usd"] for row in map(json.loads, shown.stdout.splitlines())}
    for team in teams:
        assert usd_to_nanos(spent[team]) == told[team]
        ledger = cli("budget", "ledger", "--team", team, "--json", "--config", str(path))
        assert (
            sum(usd_to_nanos(json.loads(line)["usd"]) for line in ledger.stdout.splitlines())
            == told[team]
        )
    audit = cli("budget", "audit", "--config", str(path))
    assert audit.exit_code == 0, audit.output
    redis_cluster.delete_prefix(prefix)


def test_a_cluster_store_on_a_server_without_cluster_mode_is_not_ready_and_never_500(
    upstream: str,
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path / "router.yaml", upstream, REDIS_URL, random_prefix(), ["alpha"])
    with proxies([path], tmp_path) as (proxy,):
        ready = httpx.get(proxy.url + "/readyz", timeout=10)
        assert ready.status_code == 503 and not ready.json()["checks"]["budgets"]["ok"]
        r = chat(proxy.url, key_of("alpha"))
        assert r.status_code == 503, r.text  # key store unreachable, fail closed
        assert "error" in r.json()
        assert "Traceback" not in proxy.log()


def test_a_master_failover_is_not_ready_then_the_team_on_it_works_again(
    upstream: str,
    tmp_path: Path,
) -> None:
    with running_cluster() as cluster:
        teams = teams_on_every_master(cluster)
        victim_team = teams[0]
        victim = cluster.master_of_slot(key_slot(victim_team.encode()))
        seed = next(n for n in cluster.nodes if n.port != victim.port)
        path = write_config(
            tmp_path / "router.yaml",
            upstream,
            f"redis://{seed.address}/0",
            random_prefix(),
            teams,
            redis_timeout_s=0.5,
        )
        with proxies([path], tmp_path) as (proxy,):

            def ready() -> int:
                return httpx.get(proxy.url + "/readyz", timeout=10).status_code

            for team in teams:
                assert chat(proxy.url, key_of(team)).status_code == 200
            assert ready() == 200
            cluster.kill(victim)
            wait_for(lambda: ready() == 503, timeout_s=10, what="/readyz to say not ready")
            during = chat(proxy.url, key_of(victim_team))
            assert during.status_code in (200, 503), during.text  # never a 500
            cluster.wait_for_failover(timeout_s=20)
            wait_for(lambda: ready() == 200, timeout_s=10, what="/readyz ready again")
            for team in teams:
                r = chat(proxy.url, key_of(team))
                assert r.status_code == 200, r.text
            assert "Traceback" not in proxy.log()


@pytest.mark.parametrize("wait_replicas", [0, 1])
def test_a_master_killed_mid_burst_gives_no_error_leaves_no_hold_and_spares_the_other_masters(
    wait_replicas: int,
) -> None:
    """Issue 24, finding 1: with a master SIGKILLed in a burst of reserve -> settle traffic
    (benchmarks/cluster_failover.py, one short run on uvloop, as `serve` runs), before the fix
    redis-py's cluster client raised `RuntimeError: unable to perform operation on <TCPTransport
    closed=True ...>` to teams on masters that stayed up (their reserve: a 500; their settle:
    lost, and its hold renewed for as long as the replica ran). Now no call raises anything but
    a refusal, no hold is left a lease after the burst, the teams of the other masters are never
    refused nor lose a charge, and with WAIT no settle a client was told of is lost."""
    args = failover_bench.parse_args(
        [
            "--seconds=5",
            "--kill-at=1.5",
            "--concurrency=16",
            "--lease-s=2",
            "--sweep-interval-s=0.5",
            "--redis-timeout-s=2",
            "--full-coverage=no",  # docs/budgets.md: else Redis refuses every key for ~1 s
        ]
    )
    out = failover_bench.run_fresh(wait_replicas, args)
    summary = {k: out[k] for k in ("error_kinds", "untouched_why", "held_past_lease")}
    assert out["errors_5xx"] == 0, summary
    assert out["held_past_lease"] == 0 and out["renewed_set_left"] == 0, summary
    assert out["untouched_affected"] == 0, summary
    assert out["journal_left"] == 0 and out["spend_equals_ledger"], out
    assert out["reserved"] > 0 and out["refused_unavailable_victim"] > 0, out  # it did fail over
    if wait_replicas:
        assert out["settles_lost"] == 0 and out["told_not_charged_usd"] == 0, out


def test_wait_replicas_confirms_writes_on_the_cluster_and_refuses_unconfirmed_holds(
    redis_cluster: RunningCluster,
) -> None:
    """budgets.redis_wait_replicas: on the cluster (one replica per master) reserve and settle
    are confirmed; on a Redis without replicas a reserve cannot be, so it is refused (fail
    closed) and its hold released, and nothing is charged."""
    scope = BudgetScope("alpha", None, BudgetLimit(limit_usd=1.0, period="total"))

    async def on(store_kind: str, url: str, prefix: str) -> list[Any]:
        store, _ = build_stores(
            BudgetsConfig(
                store=store_kind,
                redis_url=url,
                key_prefix=prefix,
                redis_wait_replicas=1,
                redis_wait_timeout_ms=200,
                redis_timeout_s=5,
            )
        )
        try:
            try:
                await store.reserve(scope, "r1", 0.5, 10)
            except BudgetUnavailable:
                return [
                    "refused",
                    (await store.status(scope))[0].reserved_nanos,
                    await store.ledger("alpha"),
                ]
            settled = await store.settle("r1", 0.25, 5)
            return ["ok", settled.charged_nanos, [e.nanos for e in await store.ledger("alpha")]]
        finally:
            await store.aclose()

    prefix = random_prefix()
    try:
        assert asyncio.run(on("redis-cluster", redis_cluster.url, prefix)) == [
            "ok",
            usd_to_nanos(0.25),
            [usd_to_nanos(0.25)],
        ]
    finally:
        redis_cluster.delete_prefix(prefix)
    single = random_prefix()
    try:
        assert asyncio.run(on("redis", REDIS_URL, single)) == ["refused", 0, []]
    finally:
        delete_prefix(single)


@pytest.mark.parametrize("kind", ["redis", "redis-cluster"])
def test_the_key_store_is_sharded_and_still_reads_keys_of_the_single_hash(
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    """Keys land in 256 hash-tagged buckets (one slot each, spread over the masters); a record
    in the old single hash `<prefix>:keys` still authenticates, and revoking it wins."""
    cluster: RunningCluster | None = (
        request.getfixturevalue("redis_cluster") if kind == "redis-cluster" else None
    )
    url = cluster.url if cluster else REDIS_URL
    prefix = random_prefix()
    legacy = KeyRecord(hash_key("sk-legacy"), "old", created=1.0)

    async def main() -> None:
        store, key_store = build_stores(
            BudgetsConfig(store=kind, redis_url=url, key_prefix=prefix, redis_timeout_s=5)
        )
        ring = KeyRing([], AuthConfig(required=True), key_store, cache_s=0)
        try:
            await store.redis.hset(f"{prefix}:keys", legacy.key_sha256, legacy.to_json())
            made = [await ring.create(f"t{i}") for i in range(20)]
            buckets = {key_store.bucket(r.key_sha256) for _, r in made}  # type: ignore[attr-defined]
            assert len(buckets) > 10
            for raw, record in made:
                assert (await ring.authenticate(f"Bearer {raw}")).key_id == record.key_id
            assert (await ring.authenticate("Bearer sk-legacy")).team == "old"
            assert len(await ring.list()) == 21
            await ring.revoke(legacy.key_id)
            with pytest.raises(AuthError, match="revoked"):
                await ring.authenticate("Bearer sk-legacy")
            assert [r.revoked is not None for r in await ring.list() if r.team == "old"] == [True]
        finally:
            await store.aclose()

    try:
        asyncio.run(main())
    finally:
        if cluster:
            cluster.delete_prefix(prefix)
        else:
            delete_prefix(prefix)


def test_a_single_redis_store_pointed_at_a_cluster_node_is_not_ready_and_never_500(
    redis_cluster: RunningCluster,
    upstream: str,
    tmp_path: Path,
) -> None:
    """What old main did with any cluster: 500 (MovedError) for teams on other masters."""
    teams = teams_on_every_master(redis_cluster)
    prefix = random_prefix()
    path = write_config(tmp_path / "router.yaml", upstream, redis_cluster.url, prefix, teams)
    text = path.read_text().replace("store: redis-cluster", "store: redis")
    path.write_text(text)
    with proxies([path], tmp_path) as (proxy,):
        assert httpx.get(proxy.url + "/readyz", timeout=10).status_code == 503
        codes = [chat(proxy.url, key_of(t)).status_code for t in teams]
        assert 500 not in codes and 503 in codes, codes
        assert "Traceback" not in proxy.log()
    redis_cluster.delete_prefix(prefix)
