"""The in-process budget store: one instance, same semantics as the Redis store."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from policies.budgets.ledger import LedgerEntry
from policies.budgets.money import usd_to_nanos
from policies.budgets.periods import minute_window
from policies.budgets.scopes import BudgetScope, scope_name
from policies.budgets.store import (
    DONE_TTL_S,
    BudgetExceeded,
    BudgetStore,
    Clock,
    Reservation,
    ScopeStatus,
    Settlement,
    SpendStanding,
    capped_charge,
)
from policies.config import BudgetLimit
from trace_format.tasks import stop_tasks

log = logging.getLogger("cost_router.budgets")


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
    interleave two check-and-reserve sequences. The clock drives periods, minutes and leases.
    """

    kind = "memory"

    def __init__(self, lease_s: float, timezone: str = "UTC", clock: Clock = time.time) -> None:
        super().__init__(lease_s, timezone, clock)
        self._state: dict[tuple[str, str], _ScopeState] = {}
        self._held: dict[str, _Held] = {}
        # Settled request id -> (nanos charged, when), oldest first; kept DONE_TTL_S, as Redis
        # keeps its done markers, so idempotency lasts as long and memory stays bounded.
        self._done: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._ledger: dict[str, list[LedgerEntry]] = {}
        self._renewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        log.warning(
            "budgets: in-process store: spend lives in this process only and is lost on "
            "restart; use budgets.store: redis when running more than one replica"
        )
        if self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            await self.renew()

    async def aclose(self) -> None:
        await stop_tasks(self._renewer)
        self._renewer = None

    async def renew(self) -> int:
        """Same contract as the Redis store: this process's open reservations keep their hold."""
        expires = self.clock() + self.lease_s
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
        expired = [
            rid
            for rid, h in self._held.items()
            if h.expires <= now and (team is None or h.reservation.team == team)
        ]
        for rid in expired:
            held = self._held.pop(rid)
            for s in held.scopes:
                self._scope(held.reservation.team, s).reserved -= held.reservation.amount_nanos
        if expired:
            log.warning("reclaimed %d expired budget reservation(s)", len(expired))
        return len(expired)

    def _charged_before(self, request_id: str, now: float) -> int | None:
        """Nanos charged to `request_id` if it was settled within DONE_TTL_S, else None."""
        while self._done:
            oldest = next(iter(self._done.values()))
            if oldest[1] > now - DONE_TTL_S:
                break
            self._done.popitem(last=False)
        done = self._done.get(request_id)
        return None if done is None else done[0]

    async def reserve(
        self, scope: BudgetScope, request_id: str, amount_usd: float, tokens: int
    ) -> Reservation:
        now = self.clock()
        self._reclaim(now, scope.team)
        if request_id in self._held:
            return self._held[request_id].reservation
        if self._charged_before(request_id, now) is not None:
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
            if limit is not None:
                if limit.rpm is not None and st.window_requests + 1 > limit.rpm:
                    raise BudgetExceeded(scope.label(name), "rpm", to_next_minute)
                if limit.tpm is not None and st.window_tokens + tokens > limit.tpm:
                    raise BudgetExceeded(scope.label(name), "tpm", to_next_minute)
                if limit.limit_usd is not None:
                    spent, cap = st.spent.get(win.id, 0), usd_to_nanos(limit.limit_usd)
                    if spent + st.reserved + amount > cap:
                        standing = SpendStanding(limit.period, cap, spent, st.reserved, amount)
                        raise BudgetExceeded(
                            scope.label(name),
                            "budget",
                            win.seconds_to_reset(now),
                            standing=standing,
                        )
            plan.append((name, st, win.id))
        for _, st, _ in plan:
            st.reserved += amount
            st.window_requests += 1
            st.window_tokens += tokens
        res = Reservation(
            request_id,
            scope.team,
            scope.key_id,
            amount,
            tokens,
            {name: pid for name, _, pid in plan},
            minute,
        )
        self._held[request_id] = _Held(res, now + self.lease_s, [n for n, _, _ in plan])
        self._local[request_id] = res
        return res

    async def settle(self, request_id: str, actual_usd: float, tokens: int) -> Settlement:
        now = self.clock()
        charged = self._charged_before(request_id, now)
        if charged is not None:
            return Settlement(request_id, charged, duplicate=True)
        res = self._local.pop(request_id, None)
        if res is None:
            raise KeyError(f"unknown reservation {request_id!r}")
        charge = capped_charge(usd_to_nanos(actual_usd), tokens, res)
        held = self._held.pop(request_id, None)
        kind = "settle" if held is not None else "direct"
        for name, pid in res.periods.items():
            st = self._scope(res.team, name)
            if held is not None:
                st.reserved -= res.amount_nanos
            st.spent[pid] = st.spent.get(pid, 0) + charge.nanos
            if st.window_minute == res.minute:
                st.window_tokens += charge.tokens - res.tokens
        self._done[request_id] = (charge.nanos, now)
        self._ledger.setdefault(res.team, []).append(
            LedgerEntry(
                request_id,
                res.team,
                res.key_id,
                charge.nanos,
                kind,
                sorted(res.periods.items()),
                now,
                charge.overage_nanos,
            )
        )
        return Settlement(request_id, charge.nanos, overage_nanos=charge.overage_nanos)

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
        now = self.clock()
        self._reclaim(now, scope.team)
        windows = self.windows(now)
        out = []
        for name, configured in scope.scope_limits():
            st = self._scope(scope.team, name)
            limit = self._effective(scope.team, name, configured)
            win = windows[limit.period if limit else "total"]
            out.append(
                ScopeStatus(
                    name,
                    limit.period if limit else "total",
                    win.id,
                    None
                    if limit is None or limit.limit_usd is None
                    else usd_to_nanos(limit.limit_usd),
                    st.spent.get(win.id, 0),
                    st.reserved,
                    win.end,
                    win.elapsed_fraction(now),
                    limit.rpm if limit else None,
                    limit.tpm if limit else None,
                )
            )
        return out

    async def set_limit(self, team: str, key_id: str | None, limit: BudgetLimit | None) -> None:
        st = self._scope(team, scope_name(key_id))
        st.override, st.has_override = limit, limit is not None

    async def reset(self, team: str, key_id: str | None = None) -> int:
        name = scope_name(key_id)
        st = self._scope(team, name)
        now = self.clock()
        # The current window of every period: whatever period the limit uses.
        pids = {w.id for w in self.windows(now).values()}
        wiped = sum(st.spent.pop(pid, 0) for pid in pids)
        self._ledger.setdefault(team, []).append(
            LedgerEntry(
                f"reset-{now:.6f}",
                team,
                key_id,
                -wiped,
                "reset",
                [(name, pid) for pid in sorted(pids)],
                now,
            )
        )
        return wiped

    async def ledger(self, team: str) -> list[LedgerEntry]:
        return list(self._ledger.get(team, []))

    async def spend(self, team: str) -> dict[tuple[str, str], int]:
        return {
            (scope, pid): v
            for (t, scope), st in self._state.items()
            if t == team
            for pid, v in st.spent.items()
            if v
        }

    async def teams(self) -> list[str]:
        return sorted({t for t, _ in self._state})

    async def sweep(self) -> int:
        return self._reclaim(self.clock())
