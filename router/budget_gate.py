"""The request path's one place that talks to the budget store: view, reserve, settle, release.

A request reserves the worst case it could cost on the priciest tier it may reach (its chosen
tier and that tier's fallbacks), so a fallback never charges more than was reserved. When that
does not fit, pricier fallbacks are dropped, then (budgets.downgrade) a cheaper tier of the policy
is tried: the request is "downgraded". Settling charges the actual cost from the upstream's
usage; a request that produced nothing releases.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.config import TierConfig
from policies.base import BudgetView
from policies.budgets.estimate import WorstCase, requested_max_tokens, worst_case
from policies.budgets.metrics import BudgetGauges
from policies.budgets.scopes import BudgetScope, ScopeLimits
from policies.budgets.store import BudgetExceeded, BudgetStore, BudgetUnavailable
from policies.config import BudgetsConfig, KeyConfig, TeamConfig
from policies.keys import Identity
from router.errors import RouterError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Admission:
    """The tiers a request may use after its reservation, and whether budget forced a cheaper
    tier than the policy chose."""

    chain: list[TierConfig]
    downgraded: bool = False


def _refusal(exc: BudgetExceeded) -> RouterError:
    headers = {}
    if exc.retry_after_s is not None:
        headers["retry-after"] = str(max(1, math.ceil(exc.retry_after_s)))
    code = "budget_exceeded" if exc.reason == "budget" else "rate_limit_exceeded"
    return RouterError(429, code, str(exc), headers=headers)


class BudgetGate:
    """Built from the sections it reads: `budgets`, `teams`, `keys`, and the tiers (prices and
    fallbacks of the chains it may downgrade to)."""

    def __init__(
        self,
        store: BudgetStore,
        settings: BudgetsConfig,
        teams: Mapping[str, TeamConfig],
        keys: Sequence[KeyConfig],
        tiers: Sequence[TierConfig],
        gauges: BudgetGauges | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.gauges = gauges  # one per metrics registry: survives hot reloads of the gate
        self.limits = ScopeLimits(teams, keys)
        self._tiers = {t.name: t for t in tiers}
        self._seen_teams: set[str] = set()
        self._views: dict[str, tuple[float, BudgetView]] = {}

    def scope(self, identity: Identity) -> BudgetScope:
        return self.limits.scope(identity.team, identity.key_id)

    async def view(self, identity: Identity) -> BudgetView | None:
        """The team's budget for policies that pace spend; None when no limit is configured
        (skips a store round trip on every unlimited request)."""
        if not self.limits.may_be_limited(identity.team):
            return None
        now = time.monotonic()
        hit = self._views.get(identity.team)
        if hit is not None and hit[0] > now:
            return hit[1]  # pacing needs the trend, not the last cent: reserve() is exact
        try:
            view = await self.store.view(self.scope(identity))
        except BudgetUnavailable:
            return None  # the policy decides without it; reserve() below enforces fail_mode
        if self.settings.view_cache_s > 0 and len(self._views) < 10_000:
            self._views[identity.team] = (now + self.settings.view_cache_s, view)
        return view

    def bound_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """With enforce_max_tokens, cap an unbounded request so the reservation is a true bound."""
        if self.settings.enforce_max_tokens and requested_max_tokens(body) is None:
            return {**body, "max_tokens": self.settings.default_max_tokens}
        return body

    async def reserve(
        self,
        request_id: str,
        identity: Identity,
        body: dict[str, Any],
        tiers: list[TierConfig],
        cheaper: list[TierConfig] | None = None,
    ) -> Admission:
        """Reserve the worst case of the first option that fits: the chain as chosen, then the
        chain without fallbacks pricier than its first tier, then (budgets.downgrade) each
        cheaper tier, priciest first. Nothing fits -> 429 `budget_exceeded` with Retry-After."""
        scope = self.scope(identity)
        if len(self._seen_teams) < 10_000:
            self._seen_teams.add(identity.team)
        first_refusal: BudgetExceeded | None = None
        for option, downgraded in self._options(body, tiers, cheaper or []):
            worst = max((self._worst(body, t) for t in option), key=lambda c: c.nanos)
            try:
                await self.store.reserve(scope, request_id, worst.usd, worst.tokens)
            except BudgetExceeded as exc:
                if exc.reason != "budget":  # rpm/tpm: no cheaper tier helps
                    raise _refusal(exc) from None
                first_refusal = first_refusal or exc
                continue
            except BudgetUnavailable as exc:
                raise RouterError(503, "budget_unavailable", str(exc)) from None
            return Admission(option, downgraded)
        assert first_refusal is not None
        raise _refusal(first_refusal)

    def _worst(self, body: dict[str, Any], tier: TierConfig) -> WorstCase:
        s = self.settings
        return worst_case(body, tier.price, s.default_max_tokens, s.prompt_estimate)

    def _options(
        self, body: dict[str, Any], chain: list[TierConfig], cheaper: list[TierConfig]
    ) -> Iterator[tuple[list[TierConfig], bool]]:
        """Lazily: most requests fit the first option and never pay for the others."""
        yield chain, False
        trimmed = self._trim(body, chain)
        if len(trimmed) < len(chain):
            yield trimmed, False
        if not self.settings.downgrade:
            return
        top = self._worst(body, chain[0]).nanos
        lower = [t for t in cheaper if self._worst(body, t).nanos < top]
        lower.sort(key=lambda t: self._worst(body, t).nanos, reverse=True)
        for tier in lower:
            own = [tier, *(self._tiers[n] for n in tier.fallback if n != tier.name)]
            yield self._trim(body, own), True

    def _trim(self, body: dict[str, Any], chain: list[TierConfig]) -> list[TierConfig]:
        """Drop fallbacks that would cost more than the chain's first tier."""
        cap = self._worst(body, chain[0]).nanos
        return [chain[0], *(t for t in chain[1:] if self._worst(body, t).nanos <= cap)]

    async def refresh_gauges(self) -> None:
        """Called on each /metrics scrape: one status read per team (configured or served)."""
        if self.gauges is None:
            return
        for team in sorted(self._seen_teams | set(self.limits.team_names)):
            try:
                statuses = await self.store.status(self.scope(Identity(team)))
            except BudgetUnavailable:
                return  # the scrape still answers; the gauges keep their last values
            self.gauges.observe(team, statuses)

    async def settle(self, request_id: str, cost_usd: float, tokens: int) -> None:
        try:
            await self.store.settle(request_id, cost_usd, tokens)
        except Exception:  # noqa: BLE001 - the answer is already sent; never fail it here
            log.exception("budget settle failed for %s", request_id)

    async def release(self, request_id: str) -> None:
        try:
            await self.store.release(request_id)
        except Exception:  # noqa: BLE001
            log.exception("budget release failed for %s", request_id)
