"""The budget store contract: what every store implements, what it returns, how it refuses.

Invariant kept by every store: for each scope with a limit,
``spent(current period) + reserved <= limit`` after every successful reserve, and a settle never
charges more than the request reserved (`capped_charge`), so settled spend never exceeds the limit.
What the actual cost exceeds the reservation by is not charged but recorded in the ledger entry as
``overage_nanos``; a negative actual cost charges nothing (usage can never credit a budget).
`tests/policies/budgets/test_store_conformance.py` checks every store kind of
`factory.STORE_KINDS` against this contract.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from policies.base import BudgetView
from policies.budgets.ledger import LedgerEntry
from policies.budgets.money import nanos_to_usd
from policies.budgets.periods import PeriodWindow, PeriodWindows
from policies.budgets.scopes import BudgetScope
from policies.config import BudgetLimit

# Wall-clock seconds; stores take one so tests can move time instead of sleeping.
Clock = Callable[[], float]

# Settled request ids are remembered this long for idempotency (about 100 bytes each in Redis);
# a journal older than this could be charged twice, so replicas must not stay cut off longer.
DONE_TTL_S = 24 * 3600


class BudgetError(Exception):
    """Base of budget errors."""


class BudgetExceeded(BudgetError):
    """The reservation does not fit: HTTP 429 `budget_exceeded` (or `rate_limited` for rpm/tpm)."""

    def __init__(
        self,
        scope: str,
        reason: str,
        retry_after_s: float | None,
        *,
        standing: SpendStanding | None = None,
    ) -> None:
        what = {
            "budget": "spend limit",
            "rpm": "requests-per-minute limit",
            "tpm": "tokens-per-minute limit",
        }.get(reason, reason)
        super().__init__(f"{scope}: {what} reached")
        self.scope = scope
        self.reason = reason
        self.retry_after_s = retry_after_s  # until the period resets; None: it never does
        self.standing = standing  # for `budget` refusals: why it did not fit


@dataclass(frozen=True, slots=True)
class SpendStanding:
    """What a refused reservation met: the scope's limit, spent and reserved, and the amount
    asked for, so the refusal can say whether waiting helps (router/proxy/budget_gate.py)."""

    period: str
    limit_nanos: int
    spent_nanos: int
    reserved_nanos: int
    amount_nanos: int

    @property
    def remaining_nanos(self) -> int:
        return max(0, self.limit_nanos - self.spent_nanos - self.reserved_nanos)

    @property
    def never_fits(self) -> bool:
        """The amount is more than the whole limit: no reset or finished request helps."""
        return self.amount_nanos > self.limit_nanos

    @property
    def fits_without_reservations(self) -> bool:
        """Requests in flight hold what this one needs: it fits once they settle or release."""
        return self.spent_nanos + self.amount_nanos <= self.limit_nanos


class BudgetUnavailable(BudgetError):
    """The budget store cannot be reached and fail_mode is 'closed': HTTP 503."""


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


@dataclass(frozen=True, slots=True)
class Reserved:
    """What a reserve whose amount a step before it chose did (RedisBudgetStore.reserve_after):
    the step's reply (None: the store was unreachable and fail_mode open admitted the fallback
    amount unchecked), and the reservation of the amount it chose: None when it chose none, or
    when the budget refused it (`refused`)."""

    head: Any
    reservation: Reservation | None
    refused: BudgetExceeded | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    request_id: str
    charged_nanos: int
    duplicate: bool = False  # this request id was already settled; nothing charged again
    deferred: bool = False  # the store was unreachable: journaled, charged when it returns
    overage_nanos: int = 0  # actual cost past the reservation: recorded, not charged


@dataclass(frozen=True, slots=True)
class Charge:
    """What a settle charges and what it leaves uncharged, in nanos and tokens."""

    nanos: int
    overage_nanos: int
    tokens: int


def capped_charge(actual_nanos: int, tokens: int, reservation: Reservation) -> Charge:
    """The one rule every store settles by: charge the actual cost, never below zero and never
    above what the request reserved (its worst case). The cap is the reservation the request
    path made, which the replica keeps (`BudgetStore._local`) even when the store's copy is gone
    (lease reclaimed, admitted while Redis was down): the direct path is capped by it too.
    Tokens (for tpm) are bounded the same way."""
    actual = max(0, actual_nanos)
    cap = max(0, reservation.amount_nanos)
    return Charge(
        min(actual, cap), max(0, actual - cap), min(max(0, tokens), max(0, reservation.tokens))
    )


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
        return BudgetView(
            limit, nanos_to_usd(self.spent_nanos), nanos_to_usd(self.reserved_nanos), self.elapsed
        )

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


class BudgetStore(ABC):
    """Async budget store. Implementations: `factory.STORE_KINDS`."""

    kind: str = "abstract"

    def __init__(self, lease_s: float, timezone: str = "UTC", clock: Clock = time.time) -> None:
        self.lease_s = lease_s
        self.zone = ZoneInfo(timezone)
        self.clock = clock
        # The replica that reserved keeps the details settle needs (scopes, periods, window).
        self._local: dict[str, Reservation] = {}
        self._windows = PeriodWindows(self.zone)

    # --- request path -----------------------------------------------------------------------
    @abstractmethod
    async def reserve(
        self, scope: BudgetScope, request_id: str, amount_usd: float, tokens: int
    ) -> Reservation:
        """Atomically check every limit of `scope` and reserve; raises BudgetExceeded."""

    @abstractmethod
    async def settle(self, request_id: str, actual_usd: float, tokens: int) -> Settlement:
        """Charge the actual cost capped by the reservation (`capped_charge`), free the rest of
        the reservation, record any overage in the ledger. Idempotent by request id."""

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
        """Start background work (lease renewal, sweeper, journal replay)."""
        return None

    async def aclose(self) -> None:
        return None

    # --- shared helpers ---------------------------------------------------------------------
    def windows(self, now: float) -> dict[str, PeriodWindow]:
        return self._windows.at(now)
