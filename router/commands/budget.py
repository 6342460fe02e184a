"""`cost-router keys ...` and `cost-router budget ...` (registered by router/cli.py).

Both act on a running deployment's Redis (the budget store named by the config file), so a key
created here works on every replica at once; with the in-process store there is nothing shared to
act on, and the commands say so.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import orjson
import typer
from pydantic import ValidationError

from policies.admin import Admin, AdminInputError, check_key_names, key_json, ledger_json
from policies.budgets.factory import SHARED_KINDS, build_stores, check_store_kind
from policies.budgets.money import nanos_to_usd
from policies.budgets.periods import PERIODS
from policies.budgets.scopes import ScopeLimits
from policies.config import AuthConfig, BudgetLimit, BudgetsConfig, KeyConfig
from policies.keys import KeyRing
from router.commands.common import fail, load_config_or_exit
from router.config import section_from_env
from trace_format.config_base import ConfigError

keys_app = typer.Typer(no_args_is_help=True)
budget_app = typer.Typer(no_args_is_help=True)

T = TypeVar("T")

ConfigOpt = typer.Option(
    None,
    "--config",
    "-c",
    envvar="COST_ROUTER_CONFIG",
    help="router config file (its budgets section names the Redis)",
)
RedisOpt = typer.Option(
    None,
    "--redis-url",
    help="override budgets.redis_url (with store redis-cluster: any node of the cluster)",
)
JsonOpt = typer.Option(False, "--json", help="print JSON instead of a table")


@dataclass(frozen=True, slots=True)
class _Sections:
    """The parts of a config file these commands read."""

    budgets: BudgetsConfig
    limits: ScopeLimits
    keys: list[KeyConfig]
    auth: AuthConfig


def _default_budgets() -> BudgetsConfig:
    """No config file: the default budgets section, with the same COST_ROUTER__BUDGETS__*
    environment overrides (and store kind check) a file would get; exit 2 naming a bad key."""
    try:
        return section_from_env("budgets", BudgetsConfig, check=lambda b: check_store_kind(b.store))
    except ConfigError as exc:
        raise fail(str(exc)) from None


def _sections(config: Path | None, redis_url: str | None) -> _Sections:
    if config is not None:
        router_config = load_config_or_exit(config)
        sections = _Sections(
            router_config.budgets,
            ScopeLimits(router_config.teams, router_config.keys),
            list(router_config.keys),
            router_config.auth,
        )
    else:
        sections = _Sections(_default_budgets(), ScopeLimits({}, []), [], AuthConfig())
    budgets = sections.budgets
    if redis_url:
        # A cluster stays a cluster: the URL then names any of its nodes.
        store = budgets.store if budgets.store in SHARED_KINDS else "redis"
        try:
            budgets = BudgetsConfig.model_validate(
                {**budgets.model_dump(), "store": store, "redis_url": redis_url}
            )
        except ValidationError as exc:
            raise fail(f"--redis-url: {exc.errors()[0]['msg']}") from None
    if budgets.store not in SHARED_KINDS:
        raise fail(
            f"budgets.store is {budgets.store!r}: keys and budgets live inside the proxy "
            "process and cannot be managed from here. Use budgets.store: redis or "
            "redis-cluster (or --redis-url), or put keys in the config file "
            "(keys: [{key_sha256, team}])."
        )
    # Never the journal: it belongs to the proxy replicas (a CLI would adopt their files).
    return replace(sections, budgets=budgets.model_copy(update={"journal_path": None}))


def _run(config: Path | None, redis_url: str | None, action: Callable[[Admin], Awaitable[T]]) -> T:
    """Build the stores and key ring, run one action of policies/admin.py (the one the admin
    API runs too), close. A key id that no key matches
    is bad input (exit 2); Redis out of reach exits 1."""
    # Imported when a command runs, so `cost-router --help` and other commands skip redis-py.
    from redis.exceptions import RedisClusterException, RedisError

    sections = _sections(config, redis_url)

    async def main() -> T:
        store, key_store = build_stores(sections.budgets)
        ring = KeyRing(
            sections.keys,
            sections.auth,
            key_store,
            sections.budgets.key_cache_s,
            sections.budgets.key_outage_grace_s,
        )
        try:
            return await action(Admin(store, ring, sections.limits))
        finally:
            await store.aclose()

    try:
        return asyncio.run(main())
    except (RedisError, RedisClusterException, OSError) as exc:
        typer.echo(f"error: cannot reach Redis at {sections.budgets.redis_url}: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyError as exc:
        raise fail(str(exc.args[0] if exc.args else exc)) from None


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _usd(value: float | None) -> str:
    return "unlimited" if value is None else f"${value:,.6f}"


# Table columns a user copies into another command (`keys revoke ID`, `budget set --team T`).
_COPIED = frozenset({"key id", "key", "request id", "team", "limit", "remaining"})


def _table(headers: list[str], rows: list[list[str]]) -> None:
    """Print a table whose every cell is printed whole: users copy key ids (to revoke a key),
    team names and limits out of these tables."""
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Column, Table

    # fold, not rich's default ellipsis: a narrow terminal gets a cell over several lines, never
    # a cut one; the columns users copy from shrink last (rich narrows wrappable columns first).
    table = Table(*(Column(h, overflow="fold", no_wrap=h in _COPIED) for h in headers))
    for row in rows:
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:
        # Piped or captured output has no width to fit, yet rich assumes 80 columns (or $COLUMNS)
        # and would wrap or cut cells: print it at the table's own width instead.
        width = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
        console = Console(width=max(width, console.width))
    console.print(table)


# --- keys -----------------------------------------------------------------------------------


def _check_team(team: str, config: Path | None, allow_unlisted: bool) -> None:
    """A key of a team the config does not list has no spend limit: refuse that (exit 2) unless
    --allow-unlisted-team says so, and then say it plainly."""
    loaded = load_config_or_exit(config) if config is not None else None
    known = sorted(loaded.teams) if loaded is not None else []
    if team in known:
        return
    if loaded is not None and team in loaded.removed_teams:
        # Its keys are refused (docs/budgets.md, "Reloads that remove a team"): no flag helps.
        raise fail(f"{config} lists team {team!r} under removed_teams: its keys are refused")
    unlimited = f"a key of team {team!r} would have no spend limit"
    if not allow_unlisted:
        where = (
            f"{config} lists no team {team!r} (teams: {', '.join(known) or 'none'})"
            if config is not None
            else "no config file (-c) lists the teams"
        )
        raise fail(
            f"{where}, so {unlimited}: add it under `teams:` (e.g. teams: {{{team}: "
            "{budget: {limit_usd: 100, period: monthly}}}), or pass "
            "--allow-unlisted-team to create an unlimited key"
        )
    typer.echo(
        f"warning: {unlimited.replace('would have', 'has')} (team {team!r} is not "
        "in the config's teams)",
        err=True,
    )


@keys_app.command("create")
def keys_create_cmd(
    team: str = typer.Option(..., "--team", help="team the key charges"),
    user: str | None = typer.Option(None, "--user", help="optional user the key belongs to"),
    name: str | None = typer.Option(None, "--name", help="label shown by `keys list`"),
    allow_unlisted_team: bool = typer.Option(
        False,
        "--allow-unlisted-team",
        help="create the key even if the config lists no such team: it has no spend limit",
    ),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Create an API key; prints it once (only its sha256 is stored)."""
    try:  # first: no flag makes a name usable, and no warning should precede the refusal
        check_key_names(team, user, name)
    except AdminInputError as exc:
        raise fail(f"--{exc.param}: {exc.args[0]}") from None
    _check_team(team, config, allow_unlisted_team)
    raw, record = _run(config, redis_url, lambda d: d.create_key(team, user, name))
    typer.echo(raw)
    typer.echo(
        f"key id {record.key_id}, team {team}" + (f", user {user}" if user else ""), err=True
    )


@keys_app.command("revoke")
def keys_revoke_cmd(
    key_id: str = typer.Argument(..., help="key id (>= 8 hex digits of its sha256)"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Revoke a key (run-time or from the config file); every replica refuses it within
    budgets.key_cache_s."""
    record = _run(config, redis_url, lambda d: d.revoke_key(key_id))
    typer.echo(f"revoked {record.key_id} (team {record.team})")


@keys_app.command("list")
def keys_list_cmd(
    config: Path | None = ConfigOpt, redis_url: str | None = RedisOpt, as_json: bool = JsonOpt
) -> None:
    """List keys (config and run-time): id, team, user, name, created, revoked."""
    records = _run(config, redis_url, lambda d: d.keys())
    if as_json:
        for r in records:
            typer.echo(orjson.dumps(key_json(r)).decode())
        return
    _table(
        ["key id", "team", "user", "name", "source", "created", "revoked"],
        [
            [
                r.key_id,
                r.team,
                r.user or "-",
                r.name or "-",
                r.source,
                _when(r.created or None),
                _when(r.revoked),
            ]
            for r in records
        ],
    )


# --- budget ---------------------------------------------------------------------------------


@budget_app.command("show")
def budget_show_cmd(
    team: str | None = typer.Option(None, "--team", help="one team (default: all)"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Spend, reservations and remaining budget per team in the current period."""
    rows = _run(config, redis_url, lambda d: d.standing(team))
    if as_json:
        for row in rows:
            typer.echo(orjson.dumps(row).decode())
        return
    _table(
        ["team", "period", "limit", "spent", "reserved", "remaining", "resets"],
        [
            [
                r["team"],
                r["period_id"],
                _usd(r["limit_usd"]),
                _usd(r["spent_usd"]),
                _usd(r["reserved_usd"]),
                _usd(r["remaining_usd"]),
                _when(r["resets_at"]),
            ]
            for r in rows
        ],
    )


@budget_app.command("set")
def budget_set_cmd(
    team: str = typer.Option(..., "--team"),
    limit_usd: float | None = typer.Option(None, "--limit-usd", min=0, help="USD per period"),
    period: str = typer.Option("monthly", "--period", help=" | ".join(PERIODS)),
    rpm: int | None = typer.Option(None, "--rpm", min=1, help="requests per minute"),
    tpm: int | None = typer.Option(None, "--tpm", min=1, help="tokens per minute"),
    key: str | None = typer.Option(None, "--key", help="a key id: set that key's budget"),
    clear: bool = typer.Option(False, "--clear", help="drop the override (config applies again)"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Override a team's (or key's) limit on the running deployment; takes effect at once."""
    limit = None
    if not clear:
        if limit_usd is None and rpm is None and tpm is None:
            raise fail("give --limit-usd, --rpm or --tpm (or --clear)")
        if period not in PERIODS:
            raise fail(f"--period {period!r}: not a budget period; use one of {', '.join(PERIODS)}")
        try:
            limit = BudgetLimit(limit_usd=limit_usd, period=period, rpm=rpm, tpm=tpm)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise fail(f"invalid limit: {exc.errors()[0]['msg']}") from None

    _run(config, redis_url, lambda d: d.set_limit(team, key, limit))
    what = f"key {key} of team {team}" if key else f"team {team}"
    typer.echo(
        f"{what}: "
        + (
            "override cleared"
            if limit is None
            else f"limit {_usd(limit_usd)} {period}, rpm {rpm or '-'}, tpm {tpm or '-'}"
        )
    )


@budget_app.command("reset")
def budget_reset_cmd(
    team: str = typer.Option(..., "--team"),
    key: str | None = typer.Option(None, "--key", help="a key id: reset that key's spend"),
    yes: bool = typer.Option(False, "--yes", help="do not ask for confirmation"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Zero the current period's spend (the ledger keeps a `reset` entry for audit)."""
    if not yes:
        typer.confirm(f"Reset the current spend of team {team}?", abort=True)

    wiped = _run(config, redis_url, lambda d: d.reset(team, key))
    typer.echo(f"team {team}: wiped {_usd(nanos_to_usd(wiped))} of current spend")


@budget_app.command("ledger")
def budget_ledger_cmd(
    team: str = typer.Option(..., "--team"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Audit: every charge of a team from the append-only ledger, and their total."""
    entries = _run(config, redis_url, lambda d: d.ledger(team))
    if as_json:
        for e in entries:
            typer.echo(orjson.dumps(ledger_json(e)).decode())
        return
    # Overage: cost past the reservation, recorded and never charged (docs/budgets.md).
    _table(
        ["time", "request id", "key", "kind", "usd", "overage usd"],
        [
            [
                _when(e.time),
                e.request_id,
                e.key_id or "-",
                e.kind,
                f"{nanos_to_usd(e.nanos):.9f}",
                f"{nanos_to_usd(e.overage_nanos):.9f}" if e.overage_nanos else "-",
            ]
            for e in entries
        ],
    )
    over = sum(e.overage_nanos for e in entries)
    over_note = f"; overage not charged {_usd(nanos_to_usd(over))}" if over else ""
    typer.echo(
        f"{len(entries)} entries, total {_usd(nanos_to_usd(sum(e.nanos for e in entries)))}"
        f"{over_note}"
    )


@budget_app.command("audit")
def budget_audit_cmd(
    team: str | None = typer.Option(None, "--team", help="one team (default: all)"),
    config: Path | None = ConfigOpt,
    redis_url: str | None = RedisOpt,
) -> None:
    """Rebuild spend from the ledger and compare it with the stored spend; exit 1 on a mismatch."""
    audited = _run(config, redis_url, lambda d: d.audit(team))
    rows = [
        [
            r.team,
            r.scope,
            r.period_id,
            f"{nanos_to_usd(r.stored_nanos):.9f}",
            f"{nanos_to_usd(r.ledger_nanos):.9f}",
            "ok" if r.ok else "MISMATCH",
        ]
        for r in audited
    ]
    _table(["team", "scope", "period", "stored usd", "ledger usd", ""], rows)
    if any(r[-1] != "ok" for r in rows):
        # Exit 1, not 2: the audit ran and its answer is no.
        typer.echo("stored spend differs from the ledger", err=True)
        raise typer.Exit(1)
