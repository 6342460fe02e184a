"""API keys: hashing, config and run-time keys, revocation, and the keys/budget commands."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import yaml
from typer.testing import CliRunner

from policies.config import AuthConfig, KeyConfig
from policies.keys import (
    AuthError,
    Identity,
    InMemoryKeyStore,
    KeyRing,
    KeyStore,
    RedisKeyStore,
    hash_key,
)
from router.cli import app as cli_app
from router.commands.common import EXIT_BAD_INPUT
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix

# Only the config files the commands read need a tier.
TIER = {
    "name": "small",
    "kind": "replay",
    "model": "m",
    "replay_trace": "t.jsonl",
    "price": {"input_per_mtok": 1, "output_per_mtok": 2},
}


def ring_of(
    store: KeyStore,
    required: bool,
    keys: list[dict[str, Any]] | None = None,
    cache_s: float = 5.0,
    **auth: Any,
) -> KeyRing:
    return KeyRing(
        [KeyConfig(**k) for k in keys or []], AuthConfig(required=required, **auth), store, cache_s
    )


@pytest.fixture
def prefix() -> Iterator[str]:
    p = random_prefix()
    yield p
    delete_prefix(p)


def test_keys_are_stored_only_as_hashes_and_map_to_identity() -> None:
    ring = ring_of(
        InMemoryKeyStore(),
        True,
        [{"key_sha256": hash_key("sk-alpha"), "team": "alpha", "user": "ann"}],
    )

    async def main() -> None:
        ident = await ring.authenticate("Bearer sk-alpha")
        assert ident == Identity("alpha", hash_key("sk-alpha")[:16], "ann")
        raw, record = await ring.create("beta", name="ci")
        assert raw not in record.to_json().decode() and record.key_sha256 == hash_key(raw)
        assert (await ring.authenticate(f"bearer {raw}")).team == "beta"

    asyncio.run(main())


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic abc", "Bearer sk-unknown"])
def test_missing_or_unknown_key_is_401_when_auth_required(header: str | None) -> None:
    ring = ring_of(InMemoryKeyStore(), True)
    with pytest.raises(AuthError):
        asyncio.run(ring.authenticate(header))


def test_without_required_auth_unknown_callers_use_the_default_team() -> None:
    ring = ring_of(InMemoryKeyStore(), False, default_team="public")
    assert asyncio.run(ring.authenticate(None)) == Identity("public")
    assert asyncio.run(ring.authenticate("Bearer whatever")) == Identity("public")


def test_revocation_reaches_every_replica_through_redis(prefix: str) -> None:
    keys = [{"key_sha256": hash_key("sk-conf"), "team": "alpha"}]

    async def main() -> None:
        clients = [redis.asyncio.Redis.from_url(REDIS_URL) for _ in range(2)]
        admin = ring_of(RedisKeyStore(clients[0], prefix), True, keys, cache_s=0)
        replica = ring_of(RedisKeyStore(clients[1], prefix), True, keys, cache_s=0)
        raw, record = await admin.create("beta", user="bob")
        assert await replica.authenticate(f"Bearer {raw}") == Identity("beta", record.key_id, "bob")
        await admin.revoke(record.key_id)
        with pytest.raises(AuthError, match="revoked"):
            await replica.authenticate(f"Bearer {raw}")
        # A key from the config file can be revoked at run time too.
        await admin.revoke(hash_key("sk-conf")[:12])
        with pytest.raises(AuthError):
            await replica.authenticate("Bearer sk-conf")
        listed = {r.key_id: r for r in await replica.list()}
        assert listed[record.key_id].revoked and listed[hash_key("sk-conf")[:16]].revoked
        for c in clients:
            await c.aclose()

    asyncio.run(main())


def test_cli_manages_keys_and_budgets_of_a_running_deployment(tmp_path: Any, prefix: str) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tiers": [TIER],
                "auth": {"required": True},
                "teams": {"alpha": {"budget": {"limit_usd": 2.0, "period": "daily"}}},
                "budgets": {"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
            }
        )
    )
    runner = CliRunner()

    def cli(*args: str) -> str:
        result = runner.invoke(cli_app, [*args, "--config", str(path)])
        assert result.exit_code == 0, result.output
        return result.stdout

    raw = cli("keys", "create", "--team", "alpha", "--user", "ann").strip().splitlines()[0]
    assert raw.startswith("sk-cr-")
    listed = [json.loads(line) for line in cli("keys", "list", "--json").splitlines()]
    assert [(k["team"], k["user"], k["revoked"]) for k in listed] == [("alpha", "ann", None)]
    cli("budget", "set", "--team", "alpha", "--limit-usd", "5", "--period", "monthly")
    shown = [json.loads(line) for line in cli("budget", "show", "--json").splitlines()]
    assert shown[0]["team"] == "alpha" and shown[0]["limit_usd"] == 5.0
    assert shown[0]["period"] == "monthly"
    cli("budget", "reset", "--team", "alpha", "--yes")
    cli("keys", "revoke", listed[0]["key_id"])
    listed = [json.loads(line) for line in cli("keys", "list", "--json").splitlines()]
    assert listed[0]["revoked"] is not None
    ledger = cli("budget", "ledger", "--team", "alpha", "--json").splitlines()
    assert [json.loads(line)["kind"] for line in ledger] == ["reset"]
    assert "MISMATCH" not in cli("budget", "audit")


def test_cli_refuses_the_in_process_store_clearly(tmp_path: Any) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({"tiers": [TIER]}))
    result = CliRunner().invoke(cli_app, ["keys", "list", "--config", str(path)])
    assert result.exit_code == EXIT_BAD_INPUT and "budgets.store is 'memory'" in result.output
    # Without a file the default budgets section applies: the in-process store too.
    result = CliRunner().invoke(cli_app, ["keys", "list"], env={"COST_ROUTER_CONFIG": None})
    assert result.exit_code == EXIT_BAD_INPUT and "budgets.store is 'memory'" in result.output


def test_cli_bad_config_or_arguments_exit_2(tmp_path: Any) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({"tiers": [TIER], "budgets": {"store": "nowhere"}}))
    result = CliRunner().invoke(cli_app, ["budget", "show", "--config", str(path)])
    assert result.exit_code == EXIT_BAD_INPUT and "budgets.store" in result.output
    result = CliRunner().invoke(cli_app, ["budget", "set", "--team", "a", "--redis-url", REDIS_URL])
    assert result.exit_code == EXIT_BAD_INPUT and "--limit-usd" in result.output
    result = CliRunner().invoke(
        cli_app,
        [
            "budget",
            "set",
            "--team",
            "a",
            "--limit-usd",
            "1",
            "--period",
            "fortnightly",
            "--redis-url",
            REDIS_URL,
        ],
    )
    assert result.exit_code == EXIT_BAD_INPUT
    assert "hourly, daily, weekly, monthly, total" in result.output


def test_budget_set_accepts_hourly_and_weekly(tmp_path: Any, prefix: str) -> None:
    env = {"COST_ROUTER_CONFIG": None, "COST_ROUTER__BUDGETS__KEY_PREFIX": prefix}
    for period in ("hourly", "weekly"):
        result = CliRunner().invoke(
            cli_app,
            [
                "budget",
                "set",
                "--team",
                "a",
                "--limit-usd",
                "1",
                "--period",
                period,
                "--redis-url",
                REDIS_URL,
            ],
            env=env,
        )
        assert result.exit_code == 0, result.output
        shown = CliRunner().invoke(
            cli_app, ["budget", "show", "--team", "a", "--json", "--redis-url", REDIS_URL], env=env
        )
        assert json.loads(shown.stdout.splitlines()[0])["period"] == period


def test_keys_create_refuses_a_team_the_config_does_not_list(tmp_path: Any, prefix: str) -> None:
    """Such a key would have no spend limit: exit 2 naming the known teams and how to add one;
    --allow-unlisted-team creates it and says plainly that it is unlimited."""
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tiers": [TIER],
                "teams": {"alpha": {"budget": {"limit_usd": 2.0}}, "beta": {}},
                "budgets": {"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
            }
        )
    )
    runner = CliRunner()
    refused = runner.invoke(cli_app, ["keys", "create", "--team", "nosuchteam", "-c", str(path)])
    assert refused.exit_code == EXIT_BAD_INPUT
    assert "lists no team 'nosuchteam' (teams: alpha, beta)" in refused.output
    assert "no spend limit" in refused.output and "--allow-unlisted-team" in refused.output
    listed = runner.invoke(cli_app, ["keys", "list", "--json", "-c", str(path)])
    assert listed.stdout.strip() == ""  # nothing was created
    no_file = runner.invoke(
        cli_app,
        ["keys", "create", "--team", "solo", "--redis-url", REDIS_URL],
        env={"COST_ROUTER_CONFIG": None},
    )
    assert no_file.exit_code == EXIT_BAD_INPUT and "no config file (-c)" in no_file.output
    allowed = runner.invoke(
        cli_app,
        ["keys", "create", "--team", "nosuchteam", "-c", str(path), "--allow-unlisted-team"],
    )
    assert allowed.exit_code == 0, allowed.output
    assert allowed.stdout.startswith("sk-cr-") and "has no spend limit" in allowed.stderr
    ok = runner.invoke(cli_app, ["keys", "create", "--team", "beta", "-c", str(path)])
    assert ok.exit_code == 0 and "warning" not in ok.stderr


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"COST_ROUTER__BUDGETS__STORE": "rediss"},
            "budgets.store: unknown budget store 'rediss' "
            "(known: ['memory', 'redis', 'redis-cluster'])",
        ),
        ({"COST_ROUTER__BUDGETS__LEASE_S": "0"}, "budgets.lease_s: Input should be greater than 0"),
        (
            {"COST_ROUTER__BUDGETS__FAIL_MODE": "maybe"},
            "budgets.fail_mode: Input should be 'closed' or 'open'",
        ),
        ({"COST_ROUTER__BUDGETS__NOPE": "1"}, "budgets.nope: Extra inputs are not permitted"),
    ],
)
def test_cli_without_a_config_file_names_a_bad_environment_key(
    env: dict[str, str],
    line: str,
) -> None:
    """As a bad config file does: exit 2, one line per problem naming its key, no pydantic dump
    (and a store kind that does not exist is said to be so, not to be a store kept in-process)."""
    for args in (["budget", "show"], ["keys", "list", "--redis-url", REDIS_URL]):
        result = CliRunner().invoke(cli_app, args, env={"COST_ROUTER_CONFIG": None, **env})
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert "COST_ROUTER__BUDGETS__*" in result.output and f"\n  {line}\n" in result.output
        assert "pydantic" not in result.output and "inside the proxy" not in result.output


def test_cli_without_a_config_file_uses_the_environment(prefix: str) -> None:
    env = {"COST_ROUTER_CONFIG": None, "COST_ROUTER__BUDGETS__KEY_PREFIX": prefix}
    runner = CliRunner()
    result = runner.invoke(
        cli_app,
        ["keys", "create", "--team", "solo", "--redis-url", REDIS_URL, "--allow-unlisted-team"],
        env=env,
    )
    assert result.exit_code == 0, result.output
    listed = runner.invoke(cli_app, ["keys", "list", "--json", "--redis-url", REDIS_URL], env=env)
    assert [json.loads(line)["team"] for line in listed.stdout.splitlines()] == ["solo"]


def test_budget_ledger_shows_the_overage_that_was_not_charged(tmp_path: Any, prefix: str) -> None:
    """A settle above the reservation charges the reservation; the ledger command shows the rest
    as overage (table and JSON), so an operator sees what the cap kept off the bill."""
    from policies.budgets.redis_store import RedisBudgetStore
    from policies.budgets.scopes import BudgetScope
    from policies.config import BudgetLimit, BudgetsConfig

    settings = BudgetsConfig(store="redis", redis_url=REDIS_URL, key_prefix=prefix)

    async def charge() -> None:
        store = RedisBudgetStore(settings)
        scope = BudgetScope("alpha", None, BudgetLimit(limit_usd=2.0, period="daily"))
        await store.reserve(scope, "req-1", 0.001, 10)
        await store.settle("req-1", 0.004, 10)  # 3 times the reservation past it
        await store.redis.aclose()

    asyncio.run(charge())
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tiers": [TIER],
                "teams": {"alpha": {"budget": {"limit_usd": 2.0, "period": "daily"}}},
                "budgets": {"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
            }
        )
    )
    runner = CliRunner()
    shown = runner.invoke(
        cli_app, ["budget", "ledger", "--team", "alpha", "--config", str(path), "--json"]
    )
    assert shown.exit_code == 0, shown.output
    entry = json.loads(shown.stdout.splitlines()[0])
    assert entry["usd"] == pytest.approx(0.001) and entry["overage_usd"] == pytest.approx(0.003)
    table = runner.invoke(cli_app, ["budget", "ledger", "--team", "alpha", "--config", str(path)])
    assert table.exit_code == 0 and "overage not charged $0.003" in table.stdout, table.output
