"""`cost-router keys ...` and `cost-router budget ...` (router/commands/budget.py) through the
real CLI app against the local Redis: keys and budgets of a running deployment, the in-process
store refused, bad config or arguments and a bad environment key exit 2, no config file, the
ledger's overage."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

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


@pytest.fixture
def prefix() -> Iterator[str]:
    p = random_prefix()
    yield p
    delete_prefix(p)


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
