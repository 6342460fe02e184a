"""The request path's one place that talks to the budget store: view, reserve, settle, release.

A request reserves the worst case it could cost on the priciest tier it may reach (its chosen
tier and that tier's fallbacks), so a fallback never charges more than was reserved. When that
does not fit, pricier fallbacks are dropped, then (budgets.downgrade) a cheaper tier of the policy
is tried: the request is "downgraded". Settling charges the actual cost from the upstream's
usage; a request that produced nothing releases. A request whose session still has to choose its
tier reserves in the same round trip as the session's step (`ride`), and `reserve` goes on from
what that did.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.config import TierConfig
from policies.base import BudgetView
from policies.budgets.estimate import (
    TOKEN_BOUND_NAMES,
    WorstCase,
    bound_fields,
    bound_source,
    prompt_counter,
    requested_max_tokens,
    worst_case,
)
from policies.budgets.metrics import BudgetGauges
from policies.budgets.money import nanos_to_usd
from policies.budgets.scopes import BudgetScope, ScopeLimits
from policies.budgets.store import BudgetExceeded, BudgetStore, BudgetUnavailable, SpendStanding
from policies.config import BudgetsConfig, KeyConfig, TeamConfig
from policies.keys import Identity
from policies.sessions.store import ReserveOptions, StepReserved
from router.http.errors import RouterError
from router.proxy.usage_guard import UsageBound

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Admission:
    """The tiers a request may use after its reservation, and whether budget forced a cheaper
    tier than the policy chose."""

    chain: list[TierConfig]
    downgraded: bool = False
    reserved_nanos: int = 0  # the reservation: what settle may charge at most


def _usd(nanos: int) -> str:
    return "$" + f"{nanos_to_usd(nanos):,.6f}".rstrip("0").rstrip(".")


# A request blocked only by reservations of requests in flight may fit in a moment.
IN_FLIGHT_RETRY_S = 1


def _spend_refusal(
    exc: BudgetExceeded, standing: SpendStanding, worst: WorstCase | None, bound_from: str
) -> tuple[str, float | None]:
    """The refusal's message and Retry-After (None: waiting cannot help). Says what the
    request's worst case is, what is left, and what to change."""
    ask = f"this request's worst case {_usd(standing.amount_nanos)}"
    if worst is not None and worst.completion_tokens:
        ask += (
            f" ({worst.prompt_tokens} prompt tokens estimated, up to "
            f"{worst.completion_tokens} completion tokens from {bound_from})"
        )
    elif worst is not None:  # embeddings: the prompt is all there is
        ask += f" ({worst.prompt_tokens} prompt tokens estimated)"
    limit = f"the {standing.period} spend limit {_usd(standing.limit_nanos)}"
    if standing.never_fits:
        return (
            f"{exc.scope}: {ask} is more than {limit} itself: lower max_tokens, or raise "
            "the limit (cost-router budget set)",
            None,
        )
    left = f"{ask} is more than what is left of {limit}, {_usd(standing.remaining_nanos)}"
    if standing.fits_without_reservations:
        return (
            f"{exc.scope}: {left} ({_usd(standing.reserved_nanos)} is held by requests in "
            "flight): retry when they finish, or lower max_tokens",
            IN_FLIGHT_RETRY_S,
        )
    if exc.retry_after_s is None:
        return (
            f"{exc.scope}: {left}, and a total limit never resets: lower max_tokens, or "
            "raise the limit (cost-router budget set)",
            None,
        )
    return (
        f"{exc.scope}: {left}: lower max_tokens, raise the limit (cost-router budget set), "
        "or retry when the period resets (Retry-After)",
        exc.retry_after_s,
    )


def _refusal(
    exc: BudgetExceeded, worst: WorstCase | None = None, bound_from: str = ""
) -> RouterError:
    message, retry_after_s = str(exc), exc.retry_after_s
    if exc.reason == "budget" and exc.standing is not None:
        message, retry_after_s = _spend_refusal(exc, exc.standing, worst, bound_from)
    headers = {}
    if retry_after_s is not None:
        headers["retry-after"] = str(max(1, math.ceil(retry_after_s)))
    code = "budget_exceeded" if exc.reason == "budget" else "rate_limit_exceeded"
    return RouterError(429, code, message, headers=headers)


class BudgetGate:
    """Built from the sections it reads: `budgets`, `teams`, `keys`, and the tiers by name
    (prices and fallbacks of the chains it may downgrade to)."""

    def __init__(
        self,
        store: BudgetStore,
        settings: BudgetsConfig,
        teams: Mapping[str, TeamConfig],
        keys: Sequence[KeyConfig],
        tiers: Mapping[str, TierConfig],
        gauges: BudgetGauges | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.gauges = gauges  # one per metrics registry: survives hot reloads of the gate
        self.limits = ScopeLimits(teams, keys)
        self._tiers = tiers
        for tier in tiers.values():  # load each known tokenizer now (cached), not on a request
            prompt_counter(tier, settings.prompt_estimate)
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

    def bound_body(self, body: dict[str, Any], endpoint: str) -> dict[str, Any]:
        """The body the upstream gets, carrying exactly the bound `reserve` reserves for.

        Every completion-bound field present (both names) is set to the endpoint's bound (the
        largest of the fields it obeys), so an upstream honouring either name stops there; with
        enforce_max_tokens an unbounded request gets default_max_tokens in a field it obeys."""
        bound = requested_max_tokens(body, endpoint)
        if bound is None:
            if not self.settings.enforce_max_tokens:
                return body
            bound = self.settings.default_max_tokens
        obeyed = bound_fields(endpoint)
        present = [name for name in TOKEN_BOUND_NAMES if name in body]
        if any(n in obeyed for n in present) and all(body[n] == bound for n in present):
            return body
        out = {**body, **dict.fromkeys(present, bound)}
        if not any(n in obeyed for n in present):
            out["max_tokens"] = bound  # the one name every endpoint obeys
        return out

    async def reserve(
        self,
        request_id: str,
        identity: Identity,
        body: dict[str, Any],
        tiers: list[TierConfig],
        cheaper: list[TierConfig] | None = None,
        *,
        endpoint: str,
        bound_from: str | None = None,
        first: StepReserved | None = None,
    ) -> Admission:
        """Reserve the worst case of the first option that fits: the chain as chosen, then the
        chain without fallbacks pricier than its first tier, then (budgets.downgrade) each
        cheaper tier, priciest first. Nothing fits -> 429 `budget_exceeded`, with Retry-After
        only when waiting can help (`_spend_refusal`).
        `body` is what `bound_body` returned for `endpoint`; `bound_from` is `bound_source` of
        the body before that (bound_body may have added the default), None when they are one.
        `first`: what `ride` did, which was this chain's first option (`tiers` is the chain of
        the tier the session chose)."""
        scope = self.scope(identity)
        self._seen(identity)
        # The last option tried is the cheapest: whether waiting helps is decided by it.
        last_refusal: tuple[BudgetExceeded, WorstCase] | None = None
        for option, downgraded in self._options(body, endpoint, tiers, cheaper or []):
            worst = self._first_option(body, endpoint, option)
            if first is not None:  # this first option was tried already, by the ride
                done, first = first, None
                if done.reservation is not None:
                    return Admission(option, downgraded, done.reservation.amount_nanos)
                if done.refused is not None:
                    last_refusal = (done.refused, worst)
                    continue
            try:
                await self.store.reserve(scope, request_id, worst.usd, worst.tokens)
            except BudgetExceeded as exc:
                if exc.reason != "budget":  # rpm/tpm: no cheaper tier helps
                    raise _refusal(exc) from None
                last_refusal = (exc, worst)
                continue
            except BudgetUnavailable as exc:
                raise RouterError(503, "budget_unavailable", str(exc)) from None
            return Admission(option, downgraded, worst.nanos)
        assert last_refusal is not None
        raise _refusal(*last_refusal, bound_from or self.bound_source(body, endpoint))

    async def ride(
        self,
        identity: Identity,
        body: dict[str, Any],
        chains: Mapping[str, list[TierConfig] | None],
        step: Callable[[BudgetScope, ReserveOptions], Awaitable[StepReserved]],
        *,
        endpoint: str,
    ) -> StepReserved:
        """The request's first reserve, made in one round trip with a step that chooses its tier
        first (a session's). `chains`: the chain of each tier the step may choose (None: the
        request cannot go there); each reserves its first option's worst case, exactly what
        `reserve` would try first for that chain, so `reserve(first=...)` goes on from it. A
        rate-limit refusal is final (no cheaper tier helps), as in `reserve`."""
        self._seen(identity)
        options: dict[str, tuple[float, int] | None] = {}
        for tier, chain in chains.items():
            worst = None if chain is None else self._first_option(body, endpoint, chain)
            options[tier] = None if worst is None else (worst.usd, worst.tokens)
        try:
            done = await step(self.scope(identity), options)
        except BudgetUnavailable as exc:
            raise RouterError(503, "budget_unavailable", str(exc)) from None
        if done.refused is not None and done.refused.reason != "budget":
            raise _refusal(done.refused)
        return done

    def _seen(self, identity: Identity) -> None:
        if len(self._seen_teams) < 10_000:
            self._seen_teams.add(identity.team)

    def _first_option(
        self, body: dict[str, Any], endpoint: str, option: list[TierConfig]
    ) -> WorstCase:
        """What an option (a chain of tiers) reserves: its priciest tier's worst case."""
        return max((self._worst(body, endpoint, t) for t in option), key=lambda c: c.nanos)

    def bound_source(self, body: dict[str, Any], endpoint: str) -> str:
        """Where the completion bound reserved for `body` (as the client sent it) comes from,
        as a refusal names it: the client's field, else budgets.default_max_tokens."""
        field = bound_source(body, endpoint)
        if field is not None:
            return field
        return (
            "budgets.default_max_tokens (the request sets no "
            f"{' or '.join(bound_fields(endpoint))})"
        )

    def _worst(self, body: dict[str, Any], endpoint: str, tier: TierConfig) -> WorstCase:
        s = self.settings
        counter = prompt_counter(tier, s.prompt_estimate)  # the tier's own tokenizer, if known
        return worst_case(
            body, tier.price, s.default_max_tokens, s.prompt_estimate, endpoint, counter
        )

    def _options(
        self,
        body: dict[str, Any],
        endpoint: str,
        chain: list[TierConfig],
        cheaper: list[TierConfig],
    ) -> Iterator[tuple[list[TierConfig], bool]]:
        """Lazily: most requests fit the first option and never pay for the others."""
        yield chain, False
        trimmed = self._trim(body, endpoint, chain)
        if len(trimmed) < len(chain):
            yield trimmed, False
        if not self.settings.downgrade:
            return
        top = self._worst(body, endpoint, chain[0]).nanos
        lower = [t for t in cheaper if self._worst(body, endpoint, t).nanos < top]
        lower.sort(key=lambda t: self._worst(body, endpoint, t).nanos, reverse=True)
        for tier in lower:
            own = [tier, *(self._tiers[n] for n in tier.fallback if n != tier.name)]
            yield self._trim(body, endpoint, own), True

    def _trim(
        self, body: dict[str, Any], endpoint: str, chain: list[TierConfig]
    ) -> list[TierConfig]:
        """Drop fallbacks that would cost more than the chain's first tier."""
        cap = self._worst(body, endpoint, chain[0]).nanos
        return [chain[0], *(t for t in chain[1:] if self._worst(body, endpoint, t).nanos <= cap)]

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

    def usage_bound(
        self, body: dict[str, Any], endpoint: str, tier: TierConfig, reserved_nanos: int
    ) -> UsageBound:
        """What the answering tier's usage is checked against (router/proxy/usage_guard.py): `body`
        as sent upstream, `reserved_nanos` from the request's Admission."""
        worst = self._worst(body, endpoint, tier)
        enforced = requested_max_tokens(body, endpoint) is not None
        return UsageBound(worst.prompt_tokens, worst.completion_tokens, enforced, reserved_nanos)

    async def settle(self, request_id: str, cost_usd: float, tokens: int) -> None:
        """`cost_usd`: the usage's actual cost; the store charges it up to the reservation and
        records the rest as overage (policies/budgets/store.py capped_charge)."""
        try:
            settled = await self.store.settle(request_id, cost_usd, tokens)
        except Exception:  # noqa: BLE001 - the answer is already sent; never fail it here
            # Not an outage (that is journaled inside the store) but a bug; the store has
            # already stopped renewing the hold, which runs out with its lease.
            log.exception("budget settle failed for %s", request_id)
            return
        if settled.overage_nanos:
            log.warning(
                "request %s cost %d nanos more than its reservation: not charged, "
                "recorded as overage in the ledger",
                request_id,
                settled.overage_nanos,
            )

    async def release(self, request_id: str) -> None:
        try:
            await self.store.release(request_id)
        except Exception:  # noqa: BLE001
            log.exception("budget release failed for %s", request_id)
