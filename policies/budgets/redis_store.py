"""Budget store in Redis: one Lua script per operation (`*.lua` here), one round trip per check.

Key layout and limit encoding: `codec.py`. A live replica renews the leases of its open
reservations every lease_s / 3, so a long stream keeps its hold while a dead replica's holds
expire lease_s after its last renewal. Lease expiry is Redis server time, so every replica agrees
on it whatever its own clock says; periods and rpm/tpm minutes follow the store's clock.

When Redis cannot be reached: fail closed (BudgetUnavailable -> 503) by default, or fail open
(admit, log, and journal the charge on this replica; the journal is replayed when Redis returns).
A settle that cannot reach Redis is journaled too, and the replay is idempotent by request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import traceback
from collections import OrderedDict
from importlib import resources
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AskError,
    ClusterError,
    ReadOnlyError,
    RedisClusterException,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from policies.budgets.codec import TeamKeys, decode_limit, encode_limit, team_of_key
from policies.budgets.journal import Journal
from policies.budgets.ledger import LedgerEntry, parse_pairs
from policies.budgets.money import usd_to_nanos
from policies.budgets.periods import PERIODS, minute_window
from policies.budgets.scopes import BudgetScope, scope_name
from policies.budgets.store import (
    DONE_TTL_S,
    BudgetExceeded,
    BudgetStore,
    BudgetUnavailable,
    Clock,
    Reservation,
    ScopeStatus,
    Settlement,
    SpendStanding,
    capped_charge,
)
from policies.config import BudgetLimit, BudgetsConfig
from trace_format.tasks import stop_tasks

log = logging.getLogger("cost_router.budgets.redis")

# OSError covers a refused or reset socket that redis-py did not wrap. The others are a Redis
# Cluster that is down or mid-failover (CLUSTERDOWN, TRYAGAIN, a slot no live master serves, a
# READONLY replica that was a master, a MOVED/ASK the cluster client gave up on, or that a plain
# client got from a cluster node): for a request, the same as an unreachable Redis.
UNREACHABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    ClusterError,
    RedisClusterException,
    TryAgainError,
    ReadOnlyError,
    AskError,
)
SCRIPTS = ("reserve", "settle", "release", "sweep", "status", "reset", "renew")
# Writes that WAIT for budgets.redis_wait_replicas: a lost one is a lost hold or charge.
DURABLE = frozenset({"reserve", "settle"})


class NotReplicated(RedisConnectionError):
    """Fewer replicas than budgets.redis_wait_replicas confirmed a reserve or settle in time:
    handled as an outage, so a failover cannot lose it unseen (a reserve is not used, a settle
    is journaled and re-applied, idempotently, until enough replicas confirm it)."""


def _script_text(name: str) -> str:
    pkg = resources.files(__package__)
    prelude = (pkg / "reclaim.lua").read_text(encoding="utf-8")
    body = (pkg / f"{name}.lua").read_text(encoding="utf-8")
    return prelude + "\n" + body if name != "reset" else body


def connection_options(settings: BudgetsConfig) -> dict[str, Any]:
    """Client options shared by the single-Redis and the cluster client."""
    return {
        "socket_timeout": settings.redis_timeout_s,
        "socket_connect_timeout": settings.redis_timeout_s,
        "max_connections": 512,
        # One quick retry: reserve and settle are idempotent by request id, and an outage must
        # be reported within ~redis_timeout_s, not after seconds of backoff.
        "retry": Retry(ExponentialBackoff(cap=0.05, base=0.01), 1),
    }


def transport_race(exc: BaseException) -> bool:
    """An AttributeError/TypeError raised inside redis-py or asyncio's transport: a connection
    closed (the peer died, a failover) while it was being written to. redis-py lets these out
    instead of a ConnectionError (redis/redis-py#4287); to the store they are an outage."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_TRANSPORT_DIRS)


_TRANSPORT_DIRS = (os.path.dirname(redis.__file__), os.path.dirname(asyncio.__file__))


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisBudgetStore(BudgetStore):
    kind = "redis"

    def __init__(
        self, settings: BudgetsConfig, client: Any | None = None, clock: Clock = time.time
    ) -> None:
        super().__init__(settings.lease_s, settings.timezone, clock)
        self.settings = settings
        self.prefix = settings.key_prefix
        self.fail_open = settings.fail_mode == "open"
        self.redis = client or self._connect(settings)
        # Writes whose WAIT got fewer replicas than budgets.redis_wait_replicas (a failover now
        # could lose them).
        self.unreplicated = 0
        self._scripts = {n: self.redis.register_script(_script_text(n)) for n in SCRIPTS}
        self.journal = Journal(settings.journal_path)
        # Recent settles of this replica: a repeated settle is answered without a round trip
        # (the done markers in Redis stay the authority, for other replicas and after a restart).
        self._settled: OrderedDict[str, Settlement] = OrderedDict()
        self._task: asyncio.Task[None] | None = None

    def _connect(self, settings: BudgetsConfig) -> Any:
        return aioredis.Redis.from_url(settings.redis_url, **connection_options(settings))

    def keys(self, team: str) -> TeamKeys:
        return TeamKeys(self.prefix, team)

    def _node_client(self, key: str) -> Any:
        """A client whose pipeline runs on one connection to the node holding `key` (WAIT
        counts the replicas of that connection's own writes)."""
        return self.redis

    async def _eval(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run a budget script (see _run_script); a transport race is an unreachable Redis."""
        try:
            return await self._run_script(name, keys, args)
        except (AttributeError, TypeError) as exc:
            if not transport_race(exc):
                raise
            raise RedisConnectionError(f"connection closed during a write: {exc!r}") from exc

    async def _run_script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """For reserve and settle with budgets.redis_wait_replicas, WAIT on the same connection
        until that many replicas have the write."""
        script = self._scripts[name]
        if not self.settings.redis_wait_replicas or name not in DURABLE:
            return await script(keys=keys, args=args)
        pipe = self._node_client(keys[0]).pipeline(transaction=False)
        await script(keys=keys, args=args, client=pipe)  # queued; loaded by the pipeline
        pipe.wait(self.settings.redis_wait_replicas, self.settings.redis_wait_timeout_ms)
        reply, acked = await pipe.execute()
        if int(acked) < self.settings.redis_wait_replicas:
            self.unreplicated += 1
            raise NotReplicated(
                f"{name} of {args[0]} reached {int(acked)} of {self.settings.redis_wait_replicas} "
                f"replica(s) within {self.settings.redis_wait_timeout_ms} ms"
            )
        return reply

    # --- request path -----------------------------------------------------------------------
    async def reserve(
        self, scope: BudgetScope, request_id: str, amount_usd: float, tokens: int
    ) -> Reservation:
        now = self.clock()
        wins = self.windows(now)
        minute, to_next = minute_window(now)
        k = self.keys(scope.team)
        amount = usd_to_nanos(amount_usd)
        scopes = scope.scope_limits()
        args: list[Any] = [request_id, amount, tokens, int(self.lease_s * 1000), f"{to_next:.3f}"]
        args.append(len(PERIODS))
        for p in PERIODS:  # every period's current window: name, id, seconds to its reset
            reset = wins[p].seconds_to_reset(now)
            args += [p, wins[p].id, "-1" if reset is None else f"{reset:.3f}"]
        args.append(len(scopes))
        for name, limit in scopes:
            args += [name, encode_limit(limit)]
        keys = [k.spend, k.reserved, k.res, k.lease, k.limits, k.rate(minute), k.done(minute)]
        try:
            reply = await self._eval("reserve", keys, args)
        except UNREACHABLE as exc:
            if isinstance(exc, NotReplicated):  # a hold a failover could lose is not used
                with contextlib.suppress(*UNREACHABLE):  # else the lease frees it
                    await self._eval(
                        "release", [k.reserved, k.res, k.lease, k.rate(minute)], [request_id]
                    )
            return self._unreachable_reserve(scope, request_id, amount, tokens, minute, exc)
        status = _s(reply[0])
        if status == "exceeded":
            name, reason, retry = _s(reply[1]), _s(reply[2]), float(_s(reply[3]))
            standing = None
            if len(reply) == 8:  # a spend refusal: what the limit met (reserve.lua)
                cap, spent, held = (int(_s(v)) for v in reply[4:7])
                standing = SpendStanding(_s(reply[7]), cap, spent, held, amount)
            raise BudgetExceeded(
                scope.label(name), reason, None if retry < 0 else retry, standing=standing
            )
        if status == "settled":
            raise ValueError(f"request id {request_id!r} was already settled")
        if status == "held":
            rec = orjson.loads(reply[1])
            res = Reservation(
                request_id, scope.team, scope.key_id, int(rec["a"]), int(rec["t"]), rec["p"], minute
            )
        else:
            periods = {_s(reply[i]): _s(reply[i + 1]) for i in range(2, len(reply), 5)}
            res = Reservation(request_id, scope.team, scope.key_id, amount, tokens, periods, minute)
        self._local[request_id] = res
        return res

    def _unreachable_reserve(
        self,
        scope: BudgetScope,
        request_id: str,
        amount: int,
        tokens: int,
        minute: int,
        exc: BaseException,
    ) -> Reservation:
        if not self.fail_open:
            log.error(
                "budget store unreachable, refusing request %s (fail_mode closed): %s",
                request_id,
                exc,
            )
            raise BudgetUnavailable("budget store unreachable") from None
        log.warning(
            "budget store unreachable, admitting request %s unchecked (fail_mode open): %s",
            request_id,
            exc,
        )
        wins = self.windows(self.clock())
        periods = {
            name: wins[limit.period if limit else "total"].id
            for name, limit in scope.scope_limits()
        }
        res = Reservation(
            request_id, scope.team, scope.key_id, amount, tokens, periods, minute, degraded=True
        )
        self._local[request_id] = res
        return res

    async def settle(self, request_id: str, actual_usd: float, tokens: int) -> Settlement:
        if request_id in self._settled:
            prev = self._settled[request_id]
            return Settlement(request_id, prev.charged_nanos, duplicate=True)
        res = self._local.get(request_id)
        if res is None:
            raise KeyError(f"unknown reservation {request_id!r}")
        charge = capped_charge(usd_to_nanos(actual_usd), tokens, res)
        entry = {
            "rid": request_id,
            "team": res.team,
            "key": res.key_id or "",
            "nanos": charge.nanos,
            "overage": charge.overage_nanos,
            "tokens": charge.tokens,
            "periods": res.periods,
            "minute": res.minute,
        }
        if res.degraded:
            return self._defer(entry, "admitted while the store was down")
        try:
            out = await self._apply(entry)
        except UNREACHABLE as exc:
            return self._defer(entry, str(exc))
        del self._local[request_id]
        self._settled[request_id] = out
        while len(self._settled) > 10_000:
            self._settled.popitem(last=False)
        return out

    def _defer(self, entry: dict[str, Any], why: str) -> Settlement:
        log.warning(
            "journaling charge of %s (%d nanos) to apply later: %s",
            entry["rid"],
            entry["nanos"],
            why,
        )
        self.journal.add(entry)
        self._local.pop(entry["rid"], None)
        return Settlement(entry["rid"], entry["nanos"], deferred=True)

    async def _apply(self, entry: dict[str, Any]) -> Settlement:
        k = self.keys(entry["team"])
        rid = entry["rid"]
        args: list[Any] = [
            rid,
            entry["nanos"],
            entry["tokens"],
            DONE_TTL_S,
            entry["team"],
            entry["key"],
            entry.get("overage", 0),
            len(entry["periods"]),
        ]
        for name, pid in entry["periods"].items():
            args += [name, pid]
        keys = [
            k.spend,
            k.reserved,
            k.res,
            k.lease,
            k.ledger,
            k.done(entry["minute"]),
            k.rate(entry["minute"]),
        ]
        reply = await self._eval("settle", keys, args)
        if _s(reply[0]) == "dup":
            return Settlement(rid, int(_s(reply[1])), duplicate=True)
        if _s(reply[1]) == "direct":
            log.info("settled %s without a live reservation (lease reclaimed or fail-open)", rid)
        return Settlement(rid, entry["nanos"], overage_nanos=entry.get("overage", 0))

    async def release(self, request_id: str) -> None:
        res = self._local.pop(request_id, None)
        if res is None or res.degraded:
            return
        k = self.keys(res.team)
        try:
            await self._eval(
                "release", [k.reserved, k.res, k.lease, k.rate(res.minute)], [request_id]
            )
        except UNREACHABLE as exc:
            # Nothing is owed; the lease frees the hold when it expires.
            log.warning("could not release %s (lease will reclaim it): %s", request_id, exc)

    async def replay_journal(self) -> int:
        """Apply journaled charges (idempotent); returns how many were applied."""
        applied: list[str] = []
        for rid, entry in list(self.journal.entries.items()):
            try:
                await self._apply(entry)
            except UNREACHABLE:
                break
            applied.append(rid)
        if applied:
            self.journal.done(applied)
            log.info("applied %d journaled charge(s)", len(applied))
        return len(applied)

    # --- reads and operators ----------------------------------------------------------------
    async def status(self, scope: BudgetScope) -> list[ScopeStatus]:
        now = self.clock()
        wins = self.windows(now)
        k = self.keys(scope.team)
        scopes = scope.scope_limits()
        args = [len(PERIODS), *(wins[p].id for p in PERIODS), *(n for n, _ in scopes)]
        try:
            reply = await self._eval(
                "status", [k.spend, k.reserved, k.res, k.lease, k.limits], args
            )
        except UNREACHABLE:
            raise BudgetUnavailable("budget store unreachable") from None
        out = []
        for i, (name, configured) in enumerate(scopes):
            width = len(PERIODS) + 2  # override, spent per period, reserved
            override, *spent_by_period, reserved = (
                _s(v) for v in reply[width * i : width * (i + 1)]
            )
            limit = decode_limit(override) if override else configured
            period = limit.period if limit else "total"
            spent = dict(zip(PERIODS, spent_by_period, strict=True))[period]
            win = wins[period]
            out.append(
                ScopeStatus(
                    name,
                    period,
                    win.id,
                    None
                    if limit is None or limit.limit_usd is None
                    else usd_to_nanos(limit.limit_usd),
                    int(spent),
                    int(reserved),
                    win.end,
                    win.elapsed_fraction(now),
                    limit.rpm if limit else None,
                    limit.tpm if limit else None,
                )
            )
        return out

    async def set_limit(self, team: str, key_id: str | None, limit: BudgetLimit | None) -> None:
        k = self.keys(team)
        field = scope_name(key_id)
        if limit is None:
            await self.redis.hdel(k.limits, field)
        else:
            await self.redis.hset(k.limits, field, encode_limit(limit))

    async def reset(self, team: str, key_id: str | None = None) -> int:
        k = self.keys(team)
        wins = self.windows(self.clock())
        name = scope_name(key_id)
        wiped = await self._eval(
            "reset", [k.spend, k.ledger], [name, team, key_id or "", *(wins[p].id for p in PERIODS)]
        )
        return int(_s(wiped))

    async def ledger(self, team: str) -> list[LedgerEntry]:
        out: list[LedgerEntry] = []
        last = "-"
        while True:
            batch = await self.redis.xrange(self.keys(team).ledger, min=last, count=1000)
            if last != "-":
                batch = batch[1:]  # the range is inclusive of the entry we already have
            if not batch:
                return out
            for entry_id, fields in batch:
                f = {_s(a): _s(b) for a, b in fields.items()}
                out.append(
                    LedgerEntry(
                        f["rid"],
                        f["team"],
                        f["key"] or None,
                        int(f["nanos"]),
                        f["kind"],
                        parse_pairs(f["periods"]),
                        int(_s(entry_id).split("-")[0]) / 1000,
                        int(f.get("overage") or 0),
                    )
                )
            last = _s(batch[-1][0])

    async def spend(self, team: str) -> dict[tuple[str, str], int]:
        raw = await self.redis.hgetall(self.keys(team).spend)
        out = {}
        for field, value in raw.items():
            scope, _, pid = _s(field).rpartition("|")
            if int(value):
                out[(scope, pid)] = int(value)
        return out

    async def teams(self) -> list[str]:
        found = set()
        for kind in ("reserved", "limits"):  # every team that ever reserved, or has an override
            async for key in self.redis.scan_iter(match=f"{self.prefix}:{{*}}:{kind}", count=1000):
                found.add(team_of_key(self.prefix, _s(key)))
        return sorted(found)

    async def sweep(self) -> int:
        total = 0
        for team in await self.teams():
            k = self.keys(team)
            total += int(await self._eval("sweep", [k.reserved, k.res, k.lease], []))
        if total:
            log.warning("sweeper reclaimed %d expired budget reservation(s)", total)
        return total

    async def renew(self) -> int:
        """Extend the leases of this replica's open reservations (its requests are alive)."""
        by_team: dict[str, list[str]] = {}
        for rid, res in list(self._local.items()):
            if not res.degraded:
                by_team.setdefault(res.team, []).append(rid)
        renewed = 0
        for team, rids in by_team.items():
            renewed += int(
                await self._eval(
                    "renew", [self.keys(team).lease], [int(self.lease_s * 1000), *rids]
                )
            )
        return renewed

    async def ping(self) -> bool:
        try:
            if int((await self.redis.info("cluster")).get("cluster_enabled", 0)):
                # Every team whose slot is on another node would get MOVED: not ready.
                log.error(
                    "budgets.store is redis but %s is a Redis Cluster node: use "
                    "budgets.store: redis-cluster",
                    self.settings.redis_url,
                )
                return False
            return bool(await self.redis.ping())
        except UNREACHABLE:
            return False

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._maintain())

    async def _maintain(self) -> None:
        """Sweep expired leases and replay the journal; never dies on a Redis outage."""
        next_sweep = next_renew = 0.0
        while True:
            try:
                if self.journal.entries:
                    await self.replay_journal()
                if time.monotonic() >= next_renew:
                    next_renew = time.monotonic() + self.lease_s / 3
                    await self.renew()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.settings.sweep_interval_s
                    await self.sweep()
            except UNREACHABLE as exc:
                log.debug("budget maintenance: store unreachable: %s", exc)
            except Exception:  # keep the loop alive; a bug here must not stop reclaiming
                log.exception("budget maintenance failed")
            await asyncio.sleep(min(1.0, self.settings.sweep_interval_s, self.lease_s / 3))

    async def aclose(self) -> None:
        await stop_tasks(self._task)
        self._task = None
        with contextlib.suppress(*UNREACHABLE):
            await self.replay_journal()
        self.journal.close()
        await self.redis.aclose()
