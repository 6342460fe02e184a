"""Per-team (and per-key) budgets: the store contract, its in-process implementation, and helpers.

Money is counted in integer nano-dollars (1e-9 USD) inside every store, so sums are exact and the
Redis and in-process stores agree to the last digit. A request first *reserves* its worst-case
cost (atomic check-and-reserve), then *settles* the actual cost (idempotent by request id) or
*releases* the reservation. Reservations carry a lease; expired ones are reclaimed so a replica
that dies mid-request cannot leak budget.

Invariant kept by every store: for each scope with a limit,
``spent(current period) + reserved <= limit`` after every successful reserve, and a settle never
charges more than it reserved (the request path reserves a true upper bound), so settled spend
never exceeds the limit.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import logging
import math
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

import orjson

from policies.base import BudgetView
from router.config import BudgetLimit, BudgetsConfig, Price, RouterConfig

log = logging.getLogger("cost_router.budgets")

NANOS_PER_USD = 1_000_000_000
Period = Literal["daily", "monthly", "total"]
TEAM_SCOPE = "team"
# Settled request ids are remembered this long for idempotency (about 100 bytes each in Redis);
# a journal older than this could be charged twice, so replicas must not stay cut off longer.
DONE_TTL_S = 24 * 3600


def usd_to_nanos(usd: float) -> int:
    return int(round(usd * NANOS_PER_USD))


def nanos_to_usd(nanos: int) -> float:
    return nanos / NANOS_PER_USD


def cost_nanos(price: Price, prompt_tokens: int, completion_tokens: int) -> int:
    """Exact cost in nano-dollars; monotone in both token counts (so worst case >= actual)."""
    # USD per Mtok * 1e9 nanos / 1e6 tokens = price * 1000 nanos per token.
    nanos = prompt_tokens * price.input_per_mtok * 1000
    nanos += completion_tokens * price.output_per_mtok * 1000
    return int(round(nanos))


# ---------------------------------------------------------------------------------------------
# Errors


class BudgetError(Exception):
    """Base of budget errors."""


class BudgetExceeded(BudgetError):
    """The reservation does not fit: HTTP 429 `budget_exceeded` (or `rate_limited` for rpm/tpm)."""

    def __init__(self, scope: str, reason: str, retry_after_s: float | None) -> None:
        what = {"budget": "spend limit", "rpm": "requests-per-minute limit",
                "tpm": "tokens-per-minute limit"}.get(reason, reason)
        super().__init__(f"{scope}: {what} reached")
        self.scope = scope
        self.reason = reason
        self.retry_after_s = retry_after_s


class BudgetUnavailable(BudgetError):
    """The budget store cannot be reached and fail_mode is 'closed': HTTP 503."""


# ---------------------------------------------------------------------------------------------
# Periods


@dataclass(frozen=True, slots=True)
class PeriodWindow:
    id: str  # names the period in storage keys: d20261130, m202611, total
    start: float  # UNIX seconds
    end: float | None  # None for 'total' (never resets)

    def elapsed_fraction(self, now: float) -> float:
        if self.end is None:
            return 0.0
        return min(1.0, max(0.0, (now - self.start) / (self.end - self.start)))

    def seconds_to_reset(self, now: float) -> float | None:
        return None if self.end is None else max(0.0, self.end - now)


def period_window(period: str, now: float, zone: ZoneInfo) -> PeriodWindow:
    """The period containing `now`, with boundaries at local midnight / the 1st in `zone`."""
    if period == "total":
        return PeriodWindow("total", 0.0, None)
    local = datetime.fromtimestamp(now, zone)
    if period == "daily":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        # Add a calendar day in local time; re-localise so DST days are 23 or 25 hours long.
        nxt = (start.replace(tzinfo=None) + timedelta(days=1)).replace(tzinfo=zone)
        return PeriodWindow(f"d{start:%Y%m%d}", start.timestamp(), nxt.timestamp())
    if period == "monthly":
        start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        days = calendar.monthrange(start.year, start.month)[1]
        nxt = (start.replace(tzinfo=None) + timedelta(days=days)).replace(tzinfo=zone)
        return PeriodWindow(f"m{start:%Y%m}", start.timestamp(), nxt.timestamp())
    raise ValueError(f"unknown budget period {period!r}")


def minute_window(now: float) -> tuple[int, float]:
    """rpm/tpm use fixed one-minute windows (UTC minutes): (minute number, seconds to the next)."""
    minute = int(now // 60)
    return minute, (minute + 1) * 60 - now


# ---------------------------------------------------------------------------------------------
# Scopes and results


def key_scope(key_id: str) -> str:
    return f"key:{key_id}"


@dataclass(frozen=True, slots=True)
class BudgetScope:
    """Whose budget a request draws on: its team and, when it has one, its API key."""

    team: str
    key_id: str | None = None
    team_limit: BudgetLimit | None = None  # from config; a store override takes precedence
    key_limit: BudgetLimit | None = None

    def scope_limits(self) -> list[tuple[str, BudgetLimit | None]]:
        out: list[tuple[str, BudgetLimit | None]] = [(TEAM_SCOPE, self.team_limit)]
        if self.key_id is not None:
            out.append((key_scope(self.key_id), self.key_limit))
        return out


def scope_for(config: RouterConfig, team: str, key_id: str | None) -> BudgetScope:
    team_cfg = config.teams.get(team)
    key_limit = None
    if key_id is not None:
        for key in config.keys:
            if key_id_of(key.key_sha256) == key_id:
                key_limit = key.budget
                break
    return BudgetScope(team, key_id, team_cfg.budget if team_cfg else None, key_limit)


def key_id_of(key_sha256: str) -> str:
    """Public id of an API key: a prefix of its hash (safe to log, show and put in traces)."""
    return key_sha256[:16]


@dataclass(slots=True)
class Reservation:
    request_id: str
    team: str
    key_id: str | None
    amount_nanos: int
    tokens: int
    periods: dict[str, str]  # scope -> period id charged at settle
    minute: int
    degraded: bool = False  # fail-open: admitted without the store; charged later from the journal

    @property
    def amount_usd(self) -> float:
        return nanos_to_usd(self.amount_nanos)


@dataclass(frozen=True, slots=True)
class Settlement:
    request_id: str
    charged_nanos: int
    duplicate: bool = False  # this request id was already settled; nothing charged again
    deferred: bool = False  # the store was unreachable: journaled, charged when it returns

    @property
    def charged_usd(self) -> float:
        return nanos_to_usd(self.charged_nanos)


@dataclass(frozen=True, slots=True)
class ScopeStatus:
    """One scope's standing (team or key), for /v1/budget, the CLI and the metrics."""

    scope: str
    period: str
    period_id: str
    limit_nanos: int | None
    spent_nanos: int
    reserved_nanos: int
    resets_at: float | None
    elapsed: float
    rpm: int | None = None
    tpm: int | None = None

    @property
    def remaining_nanos(self) -> int | None:
        if self.limit_nanos is None:
            return None
        return max(0, self.limit_nanos - self.spent_nanos - self.reserved_nanos)

    def as_view(self) -> BudgetView:
        limit = None if self.limit_nanos is None else nanos_to_usd(self.limit_nanos)
        return BudgetView(limit, nanos_to_usd(self.spent_nanos),
                          nanos_to_usd(self.reserved_nanos), self.elapsed)

    def to_json(self) -> dict[str, Any]:
        remaining = self.remaining_nanos
        return {
            "scope": self.scope,
            "period": self.period,
            "period_id": self.period_id,
            "limit_usd": None if self.limit_nanos is None else nanos_to_usd(self.limit_nanos),
            "spent_usd": nanos_to_usd(self.spent_nanos),
            "reserved_usd": nanos_to_usd(self.reserved_nanos),
            "remaining_usd": None if remaining is None else nanos_to_usd(remaining),
            "resets_at": self.resets_at,
            "period_elapsed": round(self.elapsed, 6),
            "rpm": self.rpm,
            "tpm": self.tpm,
        }


@dataclass(slots=True)
class LedgerEntry:
    request_id: str
    team: str
    key_id: str | None
    nanos: int
    kind: str  # settle | direct (no live reservation) | reset (operator zeroed the windows)
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (scope, period id) touched
    time: float = 0.0

    @property
    def periods(self) -> dict[str, str]:
        return dict(self.pairs)


def parse_pairs(text: str) -> list[tuple[str, str]]:
    """The ledger's `periods` field: ``scope=period-id`` joined by ``;``."""
    return [(a, b) for a, _, b in (p.partition("=") for p in text.split(";") if p)]


def spend_from_ledger(entries: list[LedgerEntry]) -> dict[tuple[str, str], int]:
    """Rebuild spend per (scope, period id) from the ledger alone: the audit of the spend hash."""
    spend: dict[tuple[str, str], int] = {}
    for e in entries:
        for pair in e.pairs:
            spend[pair] = 0 if e.kind == "reset" else spend.get(pair, 0) + e.nanos
    return {k: v for k, v in spend.items() if v}


def encode_limit(limit: BudgetLimit | None) -> str:
    """A limit as the Lua scripts read it: limit_nanos|period|rpm|tpm, -1 meaning none."""
    if limit is None:
        return "-1|total|-1|-1"
    nanos = -1 if limit.limit_usd is None else usd_to_nanos(limit.limit_usd)
    return f"{nanos}|{limit.period}|{limit.rpm or -1}|{limit.tpm or -1}"


def decode_limit(text: str) -> BudgetLimit | None:
    nanos, period, rpm, tpm = text.split("|")
    if int(nanos) < 0 and int(rpm) < 0 and int(tpm) < 0:
        return None
    return BudgetLimit(
        limit_usd=None if int(nanos) < 0 else nanos_to_usd(int(nanos)),
        period=period,  # type: ignore[arg-type]
        rpm=None if int(rpm) < 0 else int(rpm),
        tpm=None if int(tpm) < 0 else int(tpm),
    )


# ---------------------------------------------------------------------------------------------
# The contract


class BudgetStore(ABC):
    """Async budget store. Implementations: InMemoryBudgetStore, RedisBudgetStore."""

    kind: str = "abstract"

    def __init__(self, lease_s: float, timezone: str = "UTC") -> None:
        self.lease_s = lease_s
        self.zone = ZoneInfo(timezone)
        # The replica that reserved keeps the details settle needs (scopes, periods, window).
        self._local: dict[str, Reservation] = {}
        self._settled: OrderedDict[str, Settlement] = OrderedDict()
        self._windows: tuple[int, dict[str, PeriodWindow]] | None = None

    # --- request path -----------------------------------------------------------------------
    @abstractmethod
    async def reserve(
        self, scope: BudgetScope, request_id: str, amount_usd: float, tokens: int
    ) -> Reservation:
        """Atomically check every limit of `scope` and reserve; raises BudgetExceeded."""

    @abstractmethod
    async def settle(self, request_id: str, actual_usd: float, tokens: int) -> Settlement:
        """Charge the actual cost, free the rest of the reservation. Idempotent by request id."""

    @abstractmethod
    async def release(self, request_id: str) -> None:
        """Drop a reservation without charging (the request failed before any output)."""

    @abstractmethod
    async def status(self, scope: BudgetScope) -> list[ScopeStatus]:
        """Team scope first, then the key scope when the request has a key."""

    async def view(self, scope: BudgetScope) -> BudgetView:
        return (await self.status(scope))[0].as_view()

    # --- operators --------------------------------------------------------------------------
    @abstractmethod
    async def set_limit(self, team: str, key_id: str | None, limit: BudgetLimit | None) -> None:
        """Override the configured limit (None removes the override)."""

    @abstractmethod
    async def reset(self, team: str, key_id: str | None = None) -> int:
        """Zero the current period's spend of a scope; returns the nanos wiped (ledger notes it)."""

    @abstractmethod
    async def ledger(self, team: str) -> list[LedgerEntry]:
        """Every charge of a team, oldest first."""

    @abstractmethod
    async def spend(self, team: str) -> dict[tuple[str, str], int]:
        """The stored spend of a team per (scope, period id), non-zero entries only."""

    @abstractmethod
    async def teams(self) -> list[str]:
        """Teams the store has state for."""

    async def sweep(self) -> int:
        """Reclaim expired reservations of every team; returns how many."""
        return 0

    async def renew(self) -> int:
        """Extend the leases of this process's open reservations; returns how many."""
        return 0

    async def ping(self) -> bool:
        return True

    async def start(self) -> None:
        """Start background work (sweeper, journal replay)."""
        return None

    async def aclose(self) -> None:
        return None

    # --- shared helpers ---------------------------------------------------------------------
    def windows(self, now: float) -> dict[str, PeriodWindow]:
        # Boundaries fall on whole seconds, so one computation serves a whole second of requests.
        second = int(now)
        cached = self._windows
        if cached is None or cached[0] != second:
            cached = (second, {p: period_window(p, now, self.zone)
                               for p in ("daily", "monthly", "total")})
            self._windows = cached
        return cached[1]

    def _remember_settled(self, settlement: Settlement) -> None:
        self._settled[settlement.request_id] = settlement
        while len(self._settled) > 10_000:
            self._settled.popitem(last=False)


# ---------------------------------------------------------------------------------------------
# In-process store


@dataclass(slots=True)
class _ScopeState:
    spent: dict[str, int] = field(default_factory=dict)  # period id -> nanos
    reserved: int = 0
    override: BudgetLimit | None = None
    has_override: bool = False
    window_minute: int = -1
    window_requests: int = 0
    window_tokens: int = 0


@dataclass(slots=True)
class _Held:
    reservation: Reservation
    expires: float
    scopes: list[str]


class InMemoryBudgetStore(BudgetStore):
    """Single-instance store with the same semantics as the Redis one (the embedded default).

    No locks needed: every method runs to completion without awaiting, so asyncio cannot
    interleave two check-and-reserve sequences.
    """

    kind = "memory"

    def __init__(self, lease_s: float, timezone: str = "UTC", clock: Any = time.time) -> None:
        super().__init__(lease_s, timezone)
        self._clock = clock
        self._state: dict[tuple[str, str], _ScopeState] = {}
        self._held: dict[str, _Held] = {}
        self._done: dict[str, int] = {}
        self._ledger: dict[str, list[LedgerEntry]] = {}
        self._renewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        log.warning("budgets: in-process store: spend lives in this process only and is lost on "
                    "restart; use budgets.store: redis when running more than one replica")
        if self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            await self.renew()

    async def aclose(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None

    async def renew(self) -> int:
        """Same contract as the Redis store: this process's open reservations keep their hold."""
        expires = self._clock() + self.lease_s
        held = [self._held[rid] for rid in self._local if rid in self._held]
        for h in held:
            h.expires = expires
        return len(held)

    def _scope(self, team: str, scope: str) -> _ScopeState:
        return self._state.setdefault((team, scope), _ScopeState())

    def _effective(
        self, team: str, scope: str, configured: BudgetLimit | None
    ) -> BudgetLimit | None:
        st = self._scope(team, scope)
        return st.override if st.has_override else configured

    def _reclaim(self, now: float, team: str | None = None) -> int:
        expired = [rid for rid, h in self._held.items()
                   if h.expires <= now and (team is None or h.reservation.team == team)]
        for rid in expired:
            held = self._held.pop(rid)
            for s in held.scopes:
                self._scope(held.reservation.team, s).reserved -= held.reservation.amount_nanos
        if expired:
            log.warning("reclaimed %d expired budget reservation(s)", len(expired))
        return len(expired)

    async def reserve(
        self, scope: BudgetScope, request_id: str, amount_usd: float, tokens: int
    ) -> Reservation:
        now = self._clock()
        self._reclaim(now, scope.team)
        if request_id in self._held:
            return self._held[request_id].reservation
        if request_id in self._done:
            raise ValueError(f"request id {request_id!r} was already settled")
        amount = usd_to_nanos(amount_usd)
        windows = self.windows(now)
        minute, to_next_minute = minute_window(now)
        plan: list[tuple[str, _ScopeState, str]] = []
        for name, configured in scope.scope_limits():
            st = self._scope(scope.team, name)
            limit = self._effective(scope.team, name, configured)
            win = windows[limit.period if limit else "total"]
            if st.window_minute != minute:
                st.window_minute, st.window_requests, st.window_tokens = minute, 0, 0
            label = scope.team if name == TEAM_SCOPE else f"{scope.team}/{name}"
            if limit is not None:
                if limit.rpm is not None and st.window_requests + 1 > limit.rpm:
                    raise BudgetExceeded(label, "rpm", to_next_minute)
                if limit.tpm is not None and st.window_tokens + tokens > limit.tpm:
                    raise BudgetExceeded(label, "tpm", to_next_minute)
                if limit.limit_usd is not None:
                    used = st.spent.get(win.id, 0) + st.reserved
                    if used + amount > usd_to_nanos(limit.limit_usd):
                        raise BudgetExceeded(label, "budget", win.seconds_to_reset(now))
            plan.append((name, st, win.id))
        for _, st, _ in plan:
            st.reserved += amount
            st.window_requests += 1
            st.window_tokens += tokens
        res = Reservation(request_id, scope.team, scope.key_id, amount, tokens,
                          {name: pid for name, _, pid in plan}, minute)
        self._held[request_id] = _Held(res, now + self.lease_s, [n for n, _, _ in plan])
        self._local[request_id] = res
        return res

    async def settle(self, request_id: str, actual_usd: float, tokens: int) -> Settlement:
        if request_id in self._done:
            return Settlement(request_id, self._done[request_id], duplicate=True)
        res = self._local.pop(request_id, None)
        if res is None:
            raise KeyError(f"unknown reservation {request_id!r}")
        actual = usd_to_nanos(actual_usd)
        held = self._held.pop(request_id, None)
        kind = "settle" if held is not None else "direct"
        for name, pid in res.periods.items():
            st = self._scope(res.team, name)
            if held is not None:
                st.reserved -= res.amount_nanos
            st.spent[pid] = st.spent.get(pid, 0) + actual
            if st.window_minute == res.minute:
                st.window_tokens += tokens - res.tokens
        self._done[request_id] = actual
        self._ledger.setdefault(res.team, []).append(
            LedgerEntry(request_id, res.team, res.key_id, actual, kind,
                        sorted(res.periods.items()), self._clock()))
        out = Settlement(request_id, actual)
        self._remember_settled(out)
        return out

    async def release(self, request_id: str) -> None:
        res = self._local.pop(request_id, None)
        held = self._held.pop(request_id, None)
        if held is None or res is None:
            return
        for name in held.scopes:
            st = self._scope(res.team, name)
            st.reserved -= res.amount_nanos
            if st.window_minute == res.minute:
                st.window_tokens -= res.tokens

    async def status(self, scope: BudgetScope) -> list[ScopeStatus]:
        now = self._clock()
        self._reclaim(now, scope.team)
        windows = self.windows(now)
        out = []
        for name, configured in scope.scope_limits():
            st = self._scope(scope.team, name)
            limit = self._effective(scope.team, name, configured)
            win = windows[limit.period if limit else "total"]
            out.append(ScopeStatus(
                name, limit.period if limit else "total", win.id,
                None if limit is None or limit.limit_usd is None else usd_to_nanos(limit.limit_usd),
                st.spent.get(win.id, 0), st.reserved, win.end, win.elapsed_fraction(now),
                limit.rpm if limit else None, limit.tpm if limit else None))
        return out

    async def set_limit(self, team: str, key_id: str | None, limit: BudgetLimit | None) -> None:
        st = self._scope(team, TEAM_SCOPE if key_id is None else key_scope(key_id))
        st.override, st.has_override = limit, limit is not None

    async def reset(self, team: str, key_id: str | None = None) -> int:
        name = TEAM_SCOPE if key_id is None else key_scope(key_id)
        st = self._scope(team, name)
        now = self._clock()
        # The current daily, monthly and total windows: whatever period the limit uses.
        pids = {w.id for w in self.windows(now).values()}
        wiped = sum(st.spent.pop(pid, 0) for pid in pids)
        self._ledger.setdefault(team, []).append(
            LedgerEntry(f"reset-{now:.6f}", team, key_id, -wiped, "reset",
                        [(name, pid) for pid in sorted(pids)], now))
        return wiped

    async def ledger(self, team: str) -> list[LedgerEntry]:
        return list(self._ledger.get(team, []))

    async def spend(self, team: str) -> dict[tuple[str, str], int]:
        return {(scope, pid): v for (t, scope), st in self._state.items() if t == team
                for pid, v in st.spent.items() if v}

    async def teams(self) -> list[str]:
        return sorted({t for t, _ in self._state})

    async def sweep(self) -> int:
        return self._reclaim(self._clock())


# ---------------------------------------------------------------------------------------------
# Worst-case estimation


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def choices_requested(body: dict[str, Any]) -> int:
    """Completions are billed per choice: n (and best_of, which generates that many)."""
    counts = [v for v in (body.get("n"), body.get("best_of"))
              if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return max(counts, default=1)


# Chat templates add role markers and sometimes a default system prompt; this covers them.
TEMPLATE_ALLOWANCE_TOKENS = 64


def prompt_token_bound(body: dict[str, Any], mode: str = "bytes") -> int:
    """Upper bound on the upstream's prompt tokens.

    'bytes': the UTF-8 length of the JSON of everything that reaches the prompt. A byte-level BPE
    token covers at least one byte, and JSON only adds characters, so this never undercounts.
    'tiktoken': cl100k token count with a 25% margin: tighter, but not a strict bound.
    """
    parts = [body.get(k) for k in ("messages", "prompt", "tools", "functions", "suffix")]
    blob = orjson.dumps([p for p in parts if p is not None])
    if mode == "tiktoken":
        from backends.tokens import count_tokens  # lazy: offline tiktoken set-up lives there

        return math.ceil(count_tokens(blob.decode("utf-8")) * 1.25) + TEMPLATE_ALLOWANCE_TOKENS
    return len(blob) + TEMPLATE_ALLOWANCE_TOKENS


@dataclass(frozen=True, slots=True)
class WorstCase:
    prompt_tokens: int
    completion_tokens: int
    nanos: int

    @property
    def usd(self) -> float:
        return nanos_to_usd(self.nanos)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def worst_case(
    body: dict[str, Any], price: Price, default_max_tokens: int, mode: str = "bytes"
) -> WorstCase:
    """prompt tokens x input price + max_tokens x output price (default when absent), per choice."""
    prompt = prompt_token_bound(body, mode)
    completion = (requested_max_tokens(body) or default_max_tokens) * choices_requested(body)
    return WorstCase(prompt, completion, cost_nanos(price, prompt, completion))


# ---------------------------------------------------------------------------------------------
# Construction


def create_store(cfg: BudgetsConfig) -> BudgetStore:
    """The configured store; the in-process one says plainly that it is single-instance."""
    if cfg.store == "redis":
        from policies.redis_budgets import RedisBudgetStore  # lazy: redis only when configured

        log.info("budgets: Redis store at %s (prefix %r, fail_mode %s, lease %.0fs)",
                 _redacted(cfg.redis_url), cfg.key_prefix, cfg.fail_mode, cfg.lease_s)
        return RedisBudgetStore(cfg)
    return InMemoryBudgetStore(cfg.lease_s, cfg.timezone)


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest
