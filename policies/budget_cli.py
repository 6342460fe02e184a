"""`cost-router keys ...` and `cost-router budget ...` (registered by router/cli.py).

Both act on a running deployment's Redis (the budget store named by the config file), so a key
created here works on every replica at once; with the in-process store there is nothing shared to
act on, and the commands say so.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
import typer

keys_app = typer.Typer(no_args_is_help=True)
budget_app = typer.Typer(no_args_is_help=True)

T = TypeVar("T")

ConfigOpt = typer.Option(None, "--config", "-c", envvar="COST_ROUTER_CONFIG",
                         help="router config file (its budgets section names the Redis)")
RedisOpt = typer.Option(None, "--redis-url", help="override budgets.redis_url")
JsonOpt = typer.Option(False, "--json", help="print JSON instead of a table")


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(1)


def _load(config: Path | None, redis_url: str | None) -> Any:
    from router.config import ConfigError, RouterConfig, config_from_dict, load_config

    try:
        if config is not None:
            cfg = load_config(config)
        else:
            # No file: a minimal config whose budgets section comes from the environment.
            cfg = config_from_dict({"tiers": [{"name": "none", "kind": "replay", "model": "none",
                                               "replay_trace": "none",
                                               "price": {"input_per_mtok": 0,
                                                         "output_per_mtok": 0}}]})
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    if redis_url:
        cfg = RouterConfig.model_validate(
            {**cfg.model_dump(), "budgets": {**cfg.budgets.model_dump(), "store": "redis",
                                             "redis_url": redis_url}})
    if cfg.budgets.store != "redis":
        raise _fail("budgets.store is 'memory': keys and budgets live inside the proxy process "
                    "and cannot be managed from here. Use budgets.store: redis (or --redis-url), "
                    "or put keys in the config file (keys: [{key_sha256, team}]).")
    return cfg


def _run(config: Path | None, redis_url: str | None,
         action: Callable[[Any, Any, Any], Awaitable[T]]) -> T:
    """Build the store and key ring, run one async action, close; Redis errors become exit 1."""
    from redis.exceptions import RedisError

    from policies.budgets import create_store
    from policies.keys import create_keyring

    cfg = _load(config, redis_url)

    async def main() -> T:
        # Never the journal: it belongs to the proxy replicas (a CLI would adopt their files).
        store = create_store(cfg.budgets.model_copy(update={"journal_path": None}))
        try:
            return await action(cfg, store, create_keyring(cfg, store))
        finally:
            await store.redis.aclose()

    try:
        return asyncio.run(main())
    except (RedisError, OSError) as exc:
        raise _fail(f"cannot reach Redis at {cfg.budgets.redis_url}: {exc}") from None
    except KeyError as exc:
        raise _fail(str(exc.args[0] if exc.args else exc)) from None


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _usd(value: float | None) -> str:
    return "unlimited" if value is None else f"${value:,.6f}"


def _table(headers: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*headers)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


# --- keys -----------------------------------------------------------------------------------


@keys_app.command("create")
def keys_create(
    team: str = typer.Option(..., "--team", help="team the key charges"),
    user: str | None = typer.Option(None, "--user", help="optional user the key belongs to"),
    name: str | None = typer.Option(None, "--name", help="label shown by `keys list`"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Create an API key; prints it once (only its sha256 is stored)."""
    raw, record = _run(config, redis_url, lambda c, s, ring: ring.create(team, user, name))
    typer.echo(raw)
    typer.echo(f"key id {record.key_id}, team {team}" + (f", user {user}" if user else ""),
               err=True)


@keys_app.command("revoke")
def keys_revoke(
    key_id: str = typer.Argument(..., help="key id (>= 8 hex digits of its sha256)"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Revoke a key (run-time or from the config file); every replica refuses it within
    budgets.key_cache_s."""
    record = _run(config, redis_url, lambda c, s, ring: ring.revoke(key_id))
    typer.echo(f"revoked {record.key_id} (team {record.team})")


@keys_app.command("list")
def keys_list(
    config: Path | None = ConfigOpt, redis_url: str | None = RedisOpt, as_json: bool = JsonOpt
) -> None:
    """List keys (config and run-time): id, team, user, name, created, revoked."""
    records = _run(config, redis_url, lambda c, s, ring: ring.list())
    if as_json:
        for r in records:
            typer.echo(orjson.dumps({"key_id": r.key_id, "team": r.team, "user": r.user,
                                     "name": r.name, "source": r.source, "created": r.created,
                                     "revoked": r.revoked}).decode())
        return
    _table(["key id", "team", "user", "name", "source", "created", "revoked"],
           [[r.key_id, r.team, r.user or "-", r.name or "-", r.source,
             _when(r.created or None), _when(r.revoked)] for r in records])


# --- budget ---------------------------------------------------------------------------------


async def _standing(cfg: Any, store: Any, team: str | None) -> list[dict[str, Any]]:
    from policies.budgets import scope_for

    teams = [team] if team else sorted(set(cfg.teams) | set(await store.teams()))
    out = []
    for name in teams:
        for status in await store.status(scope_for(cfg, name, None)):
            out.append({"team": name, **status.to_json()})
    return out


@budget_app.command("show")
def budget_show(
    team: str | None = typer.Option(None, "--team", help="one team (default: all)"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Spend, reservations and remaining budget per team in the current period."""
    rows = _run(config, redis_url, lambda c, s, ring: _standing(c, s, team))
    if as_json:
        for row in rows:
            typer.echo(orjson.dumps(row).decode())
        return
    _table(["team", "period", "limit", "spent", "reserved", "remaining", "resets"],
           [[r["team"], r["period_id"], _usd(r["limit_usd"]), _usd(r["spent_usd"]),
             _usd(r["reserved_usd"]), _usd(r["remaining_usd"]), _when(r["resets_at"])]
            for r in rows])


@budget_app.command("set")
def budget_set(
    team: str = typer.Option(..., "--team"),
    limit_usd: float | None = typer.Option(None, "--limit-usd", min=0, help="USD per period"),
    period: str = typer.Option("monthly", "--period", help="daily | monthly | total"),
    rpm: int | None = typer.Option(None, "--rpm", min=1, help="requests per minute"),
    tpm: int | None = typer.Option(None, "--tpm", min=1, help="tokens per minute"),
    key: str | None = typer.Option(None, "--key", help="a key id: set that key's budget"),
    clear: bool = typer.Option(False, "--clear", help="drop the override (config applies again)"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Override a team's (or key's) limit on the running deployment; takes effect at once."""
    from pydantic import ValidationError

    from router.config import BudgetLimit

    limit = None
    if not clear:
        if limit_usd is None and rpm is None and tpm is None:
            raise _fail("give --limit-usd, --rpm or --tpm (or --clear)")
        try:
            limit = BudgetLimit(limit_usd=limit_usd, period=period, rpm=rpm, tpm=tpm)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise _fail(f"invalid limit: {exc.errors()[0]['msg']}") from None

    async def act(cfg: Any, store: Any, ring: Any) -> None:
        key_id = (await ring.find(key)).key_id if key else None
        await store.set_limit(team, key_id, limit)

    _run(config, redis_url, act)
    what = f"key {key} of team {team}" if key else f"team {team}"
    typer.echo(f"{what}: " + ("override cleared" if limit is None else
                              f"limit {_usd(limit_usd)} {period}, rpm {rpm or '-'}, "
                              f"tpm {tpm or '-'}"))


@budget_app.command("reset")
def budget_reset(
    team: str = typer.Option(..., "--team"),
    key: str | None = typer.Option(None, "--key", help="a key id: reset that key's spend"),
    yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Zero the current period's spend (the ledger keeps a `reset` entry for audit)."""
    if not yes:
        typer.confirm(f"Reset the current spend of team {team}?", abort=True)

    async def act(cfg: Any, store: Any, ring: Any) -> int:
        key_id = (await ring.find(key)).key_id if key else None
        return await store.reset(team, key_id)

    wiped = _run(config, redis_url, act)
    typer.echo(f"team {team}: wiped {_usd(wiped / 1e9)} of current spend")


@budget_app.command("ledger")
def budget_ledger(
    team: str = typer.Option(..., "--team"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Audit: every charge of a team from the append-only ledger, and their total."""
    entries = _run(config, redis_url, lambda c, s, ring: s.ledger(team))
    if as_json:
        for e in entries:
            typer.echo(orjson.dumps({"request_id": e.request_id, "key_id": e.key_id,
                                     "usd": e.nanos / 1e9, "kind": e.kind,
                                     "periods": e.periods, "time": e.time}).decode())
        return
    _table(["time", "request id", "key", "kind", "usd"],
           [[_when(e.time), e.request_id, e.key_id or "-", e.kind, f"{e.nanos / 1e9:.9f}"]
            for e in entries])
    typer.echo(f"{len(entries)} entries, total {_usd(sum(e.nanos for e in entries) / 1e9)}")


@budget_app.command("audit")
def budget_audit(
    team: str | None = typer.Option(None, "--team", help="one team (default: all)"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Rebuild spend from the ledger and compare it with the stored spend; exit 1 on a mismatch."""
    from policies.budgets import spend_from_ledger

    async def act(cfg: Any, store: Any, ring: Any) -> list[list[str]]:
        rows = []
        for name in [team] if team else await store.teams():
            stored = await store.spend(name)
            rebuilt = spend_from_ledger(await store.ledger(name))
            for scope, pid in sorted(set(stored) | set(rebuilt)):
                a, b = stored.get((scope, pid), 0), rebuilt.get((scope, pid), 0)
                rows.append([name, scope, pid, f"{a / 1e9:.9f}", f"{b / 1e9:.9f}",
                             "ok" if a == b else "MISMATCH"])
        return rows

    rows = _run(config, redis_url, act)
    _table(["team", "scope", "period", "stored usd", "ledger usd", ""], rows)
    if any(r[-1] != "ok" for r in rows):
        raise _fail("stored spend differs from the ledger")
