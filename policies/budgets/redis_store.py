"""Budget store in Redis: one Lua script per operation (`*.lua` here), one round trip per check.

Key layout and limit encoding: `codec.py`. A live replica renews the leases of its open
reservations every lease_s / 3, so a long stream keeps its hold while a dead replica's holds
expire lease_s after its last renewal. Lease expiry is Redis server time, so every replica agrees
on it whatever its own clock says; periods and rpm/tpm minutes follow the store's clock.

When Redis cannot be reached: fail closed (BudgetUnavailable -> 503) by default, or fail open
(admit, log, and journal the charge on this replica; the journal is replayed when Redis returns).
A settle that cannot reach Redis is journaled too, and the replay is idempotent by request id.
"Cannot be reached" is decided by what an error means (`store_unavailable`), not by its type: a
failover or a closed connection surfaces from redis-py and the event loop as errors no list names
in advance. A reservation leaves the renewed set at its first settle or release attempt, whatever
that attempt's outcome, so no hold outlives its request by more than lease_s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import traceback
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    ClusterCrossSlotError,
    DataError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

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
    Reserved,
    ScopeStatus,
    Settlement,
    SpendStanding,
    capped_charge,
)
from policies.config import BudgetLimit, BudgetsConfig
from trace_format.tasks import stop_tasks

log = logging.getLogger("cost_router.budgets.redis")

# Reply errors from a live server that mean the command or script itself is wrong (a Lua error
# in one of our scripts, a key of the wrong type, keys of two slots): a bug of ours, not to be
# hidden as an outage. Every other reply error is about the server's state: a Redis Cluster
# between owners of a slot (CLUSTERDOWN, TRYAGAIN, MOVED, ASK, a READONLY replica that was a
# master), a server loading or busy, refusing writes (MISCONF, OOM, NOREPLICAS, MASTERDOWN) or
# this client (NOAUTH, NOPERM): the store is unavailable.
BUG_REPLIES = frozenset({"ERR", "WRONGTYPE", "CROSSSLOT"})
# The client library: an exception whose traceback passes through it came out of talking to
# Redis (from redis-py itself or from the event loop's transport under it).
_CLIENT_DIR = os.path.dirname(redis.__file__ or "") + os.sep


def store_unavailable(exc: BaseException) -> bool:
    """Whether `exc`, raised while a store operation talked to Redis, means the store cannot be
    used now (503 on reserve, journal and replay on settle) rather than a bug of ours.

    Everything that comes out of the client library or the transport while talking to Redis is
    an outage: redis-py's own errors (connection, timeout, cluster, authentication), OSError,
    and whatever else escapes redis-py or the event loop when a connection is closed under a
    command (a failover, or the cluster client closing a node's connections): uvloop's
    `RuntimeError: unable to perform operation on <TCPTransport closed=True ...>`, asyncio's
    AttributeError on a transport already gone (redis/redis-py#4287). Not an outage: a reply
    that means our command is wrong (`BUG_REPLIES`), arguments redis-py refused to encode
    (DataError), and any error raised by our own code outside the client."""
    if isinstance(exc, ResponseError):  # a live server answered
        return _reply_code(exc) not in BUG_REPLIES
    if isinstance(exc, DataError):
        return False
    if isinstance(exc, (RedisError, RedisClusterException, OSError)):
        return True
    return _raised_in_client(exc)


def _reply_code(exc: ResponseError) -> str:
    if isinstance(exc, ClusterCrossSlotError):
        return "CROSSSLOT"
    # redis-py strips the code of the replies it maps to a class and keeps it here; a reply it
    # does not map keeps its code as the message's first word.
    code = getattr(exc, "status_code", None)
    return str(code) if code else str(exc).split(" ", 1)[0]


def _raised_in_client(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return any(f.filename.startswith(_CLIENT_DIR) for f in frames)


SCRIPTS = ("reserve", "settle", "release", "sweep", "status", "reset", "renew")
# Writes that WAIT for budgets.redis_wait_replicas: a lost one is a lost hold or charge.
DURABLE = frozenset({"reserve", "settle"})
# Scripts that may run twice with the same effect as once (by request id, or read-only), so an
# outage error is retried: it may have been the client closing a healthy node's connection under
# the command (the cluster client does that to every node's connections on CLUSTERDOWN), and
# the next try gets a fresh one. `reset` is not: a second run would wipe what came in between.
RETRIED = frozenset({"reserve", "settle", "release", "renew", "status", "sweep"})
# Scripts added with `add_reserving` are reserves whose amount a step before them chooses
# (reserving_script): durable and retried as reserve is. Run twice with the same request id,
# the reserve in them answers `held` (the pre-step is told, and writes nothing: its contract).
RESERVING = "reserve:"


def _durable(name: str) -> bool:
    return name in DURABLE or name.startswith(RESERVING)


def _retried(name: str) -> bool:
    return name in RETRIED or name.startswith(RESERVING)


RETRIES = 2  # after the client's own one; all within redis_timeout_s of the first try
RETRY_PAUSE_S = 0.02


class StoreUnreachable(RedisConnectionError):
    """A store operation failed in a way `store_unavailable` calls an outage (the original error
    is its cause): what everything inside the store handles as Redis being down."""


class NotReplicated(StoreUnreachable):
    """Fewer replicas than budgets.redis_wait_replicas confirmed a reserve or settle in time:
    handled as an outage, so a failover cannot lose it unseen (a reserve is not used, a settle
    is journaled and re-applied, idempotently, until enough replicas confirm it)."""


def _lua(name: str) -> str:
    return (resources.files(__package__) / f"{name}.lua").read_text(encoding="utf-8")


def _script_text(name: str) -> str:
    if name == "reset":
        return _lua(name)
    parts = [_lua("reclaim"), _lua("reserve_fn") if name == "reserve" else "", _lua(name)]
    return "\n".join(parts)


def reserving_script(head: str) -> str:
    """A script that runs `head` (Lua text), which picks the amount, then the budget reserve of
    that amount in the same atomic step: what `RedisBudgetStore.reserve_after` runs."""
    return "\n".join([_lua("reclaim"), _lua("reserve_fn"), head])


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
        # Holds to release once Redis answers: request id -> (team, minute of the reservation).
        self._unreleased: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._unapplicable: set[str] = set()  # journaled charges a replay failed on (logged)
        self._task: asyncio.Task[None] | None = None

    def _connect(self, settings: BudgetsConfig) -> Any:
        return aioredis.Redis.from_url(settings.redis_url, **connection_options(settings))

    def keys(self, team: str) -> TeamKeys:
        return TeamKeys(self.prefix, team)

    async def _eval(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run a budget script (see _run_script). An error that means the store is unavailable
        (`store_unavailable`) is retried for the idempotent scripts (`RETRIED`) within
        redis_timeout_s, then raised as StoreUnreachable; any other error is raised as it is
        (a bug). NotReplicated is never retried: a second run of a script that already ran
        writes nothing, so its WAIT would confirm nothing."""
        deadline = time.monotonic() + self.settings.redis_timeout_s
        attempt = 0
        while True:
            try:
                return await self._run_script(name, keys, args)
            except NotReplicated:
                raise
            except Exception as exc:
                if not store_unavailable(exc):
                    raise
                attempt += 1
                if not _retried(name) or attempt > RETRIES or time.monotonic() >= deadline:
                    raise StoreUnreachable(f"{name}: {type(exc).__name__}: {exc}") from exc
                log.info("%s: %s: %s; trying again", name, type(exc).__name__, exc)
            await asyncio.sleep(RETRY_PAUSE_S * attempt)

    async def _run_script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return await self._run_on(self.redis, name, keys, args)

    async def _run_on(self, client: Any, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run a script through `client`. For reserve and settle with
        budgets.redis_wait_replicas, WAIT on the same connection (one pipeline) until that many
        replicas have the write."""
        script = self._scripts[name]
        if not self.settings.redis_wait_replicas or not _durable(name):
            return await script(keys=keys, args=args, client=client)
        pipe = client.pipeline(transaction=False)
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
        amount = usd_to_nanos(amount_usd)
        keys, args, minute = self._reserve_call(scope, request_id, amount, tokens)
        try:
            reply = await self._eval("reserve", keys, args)
        except StoreUnreachable as exc:
            await self._lost_reserve(scope.team, request_id, minute, exc)
            return self._unreachable_reserve(scope, request_id, amount, tokens, minute, exc)
        return self._reservation(reply, scope, request_id, amount, tokens, minute)

    def add_reserving(self, name: str, head: str) -> str:
        """Register a reserve whose amount the Lua `head` chooses (`reserving_script`); returns
        the name `reserve_after` runs it by. The head runs after the reserve's own KEYS (7) and
        ARGV; it must leave everything unwritten when the request id is already held."""
        full = RESERVING + name
        if full not in self._scripts:
            self._scripts[full] = self.redis.register_script(reserving_script(head))
        return full

    async def reserve_after(
        self,
        scope: BudgetScope,
        request_id: str,
        script: str,
        keys: list[str],
        args: list[Any],
        fallback: tuple[float, int],
    ) -> Reserved:
        """One round trip: the script `add_reserving` registered chooses the amount and the
        reserve takes it, atomically. Its reply is {head's reply, the reserve's reply or
        {'none'} (the head chose nothing to reserve), amount nanos, tokens}. The store
        unreachable: as `reserve` (503, or fail_mode open admits `fallback` unchecked, and the
        head's reply is None)."""
        amount = usd_to_nanos(fallback[0])
        own_keys, own_args, minute = self._reserve_call(scope, request_id, amount, fallback[1])
        try:
            reply = await self._eval(script, own_keys + keys, own_args + args)
        except StoreUnreachable as exc:
            await self._lost_reserve(scope.team, request_id, minute, exc)
            degraded = self._unreachable_reserve(
                scope, request_id, amount, fallback[1], minute, exc
            )
            return Reserved(None, degraded)
        head, answer = reply[0], reply[1]
        if _s(answer[0]) == "none":
            return Reserved(head, None)
        chosen, tokens = int(_s(reply[2])), int(_s(reply[3]))
        try:
            res = self._reservation(answer, scope, request_id, chosen, tokens, minute)
        except BudgetExceeded as exc:
            return Reserved(head, None, exc)
        return Reserved(head, res)

    async def _lost_reserve(
        self, team: str, request_id: str, minute: int, exc: StoreUnreachable
    ) -> None:
        # The script may have run with only its answer lost, or (NotReplicated) its hold is
        # one a failover could lose: not used either way, and released so it does not hold
        # budget for a lease. Now when Redis answered; else by maintenance, once it answers.
        if isinstance(exc, NotReplicated):
            await self._release_or_later(team, request_id, minute)
        else:
            self._later_release(team, request_id, minute)

    def _reserve_call(
        self, scope: BudgetScope, request_id: str, amount: int, tokens: int
    ) -> tuple[list[str], list[Any], int]:
        """reserve.lua's KEYS and ARGV for `amount` nanos, and the minute they are for."""
        now = self.clock()
        wins = self.windows(now)
        minute, to_next = minute_window(now)
        k = self.keys(scope.team)
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
        return keys, args, minute

    def _reservation(
        self,
        reply: Any,
        scope: BudgetScope,
        request_id: str,
        amount: int,
        tokens: int,
        minute: int,
    ) -> Reservation:
        """reserve.lua's answer: the reservation, or BudgetExceeded."""
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
        # Out of the renewed set before anything can fail: whatever this settle's outcome, its
        # hold is never renewed again, so it is gone a lease after its last renewal at the
        # latest (a charge that could not be applied is journaled, and its replay frees it).
        res = self._local.pop(request_id, None)
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
        except StoreUnreachable as exc:
            return self._defer(entry, str(exc))
        except Exception:
            # A bug (a script error): replaying would fail the same way. The charge is logged
            # whole for an operator; the hold runs out with its lease.
            log.error("settle of %s failed; charge not applied: %s", request_id, entry)
            raise
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
        res = self._local.pop(request_id, None)  # never renewed again, whatever happens next
        if res is None or res.degraded:
            return
        await self._release_or_later(res.team, request_id, res.minute)

    async def _release_or_later(self, team: str, request_id: str, minute: int) -> None:
        k = self.keys(team)
        try:
            await self._eval("release", [k.reserved, k.res, k.lease, k.rate(minute)], [request_id])
        except StoreUnreachable as exc:
            # Nothing is owed: maintenance releases it once Redis answers, its lease at the latest.
            log.warning("could not release %s now (released later): %s", request_id, exc)
            self._later_release(team, request_id, minute)

    def _later_release(self, team: str, request_id: str, minute: int) -> None:
        self._unreleased[request_id] = (team, minute)
        while len(self._unreleased) > 10_000:  # bounded: the leases free the oldest anyway
            self._unreleased.popitem(last=False)

    async def release_pending(self) -> int:
        """Release the holds a release (or a reserve whose answer was lost) could not; returns
        how many were released. Stops at the first that still cannot reach Redis."""
        done = 0
        for rid, (team, minute) in list(self._unreleased.items()):
            k = self.keys(team)
            await self._eval("release", [k.reserved, k.res, k.lease, k.rate(minute)], [rid])
            del self._unreleased[rid]
            done += 1
        return done

    async def replay_journal(self) -> int:
        """Apply journaled charges (idempotent); returns how many were applied. Stops at the
        first the store cannot take now. One that ran but is not yet confirmed by enough
        replicas (NotReplicated: a new master with no replica yet) stays journaled and the next
        is tried: each must run soon, as its run frees its hold, which nothing renews any more.
        One that fails otherwise (a bug) is kept for an operator, logged once, and passed over,
        so it holds up none of the others."""
        applied: list[str] = []
        for rid, entry in list(self.journal.entries.items()):
            try:
                await self._apply(entry)
            except NotReplicated:
                continue
            except StoreUnreachable:
                break
            except Exception:
                if rid not in self._unapplicable:
                    self._unapplicable.add(rid)
                    log.exception("journaled charge %s cannot be applied: %s", rid, entry)
                continue
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
        except StoreUnreachable:
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
            try:
                total += int(await self._eval("sweep", [k.reserved, k.res, k.lease], []))
            except StoreUnreachable:  # that team's master: the others' are swept all the same
                continue
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
            try:
                renewed += int(
                    await self._eval(
                        "renew", [self.keys(team).lease], [int(self.lease_s * 1000), *rids]
                    )
                )
            except StoreUnreachable as exc:
                # That team's master is down or failing over: the teams on the others keep
                # their holds (a lease running out under a live request would free its room).
                log.debug("could not renew the holds of %s: %s", team, exc)
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
        except Exception as exc:
            if not store_unavailable(exc):
                raise
            return False

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._maintain())

    async def _maintain(self) -> None:
        """Renew this replica's leases, replay the journal, release what could not be released,
        sweep expired leases. Never dies, and one step failing (an outage, a bug) skips none of
        the others: a replay that fails must not stop the renewals of live requests."""
        next_sweep = next_renew = 0.0
        while True:
            if time.monotonic() >= next_renew:
                next_renew = time.monotonic() + self.lease_s / 3
                await self._step("renew", self.renew)
            if self.journal.entries:
                await self._step("journal replay", self.replay_journal)
            if self._unreleased:
                await self._step("release", self.release_pending)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.settings.sweep_interval_s
                await self._step("sweep", self.sweep)
            await asyncio.sleep(min(1.0, self.settings.sweep_interval_s, self.lease_s / 3))

    @staticmethod
    async def _step(name: str, run: Callable[[], Awaitable[int]]) -> None:
        try:
            await run()
        except Exception as exc:  # keep the loop alive; a bug here must not stop reclaiming
            if store_unavailable(exc):
                log.debug("budget maintenance (%s): store unreachable: %s", name, exc)
            else:
                log.exception("budget maintenance (%s) failed", name)

    async def aclose(self) -> None:
        await stop_tasks(self._task)
        self._task = None
        with contextlib.suppress(StoreUnreachable):
            await self.replay_journal()
        self.journal.close()
        await self.redis.aclose()
