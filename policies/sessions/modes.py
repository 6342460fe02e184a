"""What a session mode makes of the policy's decision. Pure: no I/O, no clock.

The store applies a `Plan` atomically (policies/sessions/store.py): the plan says, for every
tier the session may have used last, where this request goes and why, and `fresh` for a session
the store does not know yet. So the read, the decision and the update are one store round trip,
and two replicas serving one session at once agree (the store orders them).

Precedence, highest first (docs/conversations.md): a tier the client named (no plan at all),
a context-window limit and a budget downgrade (both applied after the plan, in the request
path), the tool loop, load shedding, the session mode, the policy.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from backends.config import Price
from policies.sessions.config import Mode

# Reasons a decision gives (x-router-session `reason=`, trace `session_reason`).
NEW = "new"  # the session's first request (or its state expired): the policy decides
PER_REQUEST = "per_request"  # the mode leaves every decision to the policy
SAME = "same"  # the policy chose the session's tier again
HELD = "held"  # the mode kept the session's tier against the policy's choice
ESCALATED = "escalated"  # moved to a pricier tier (escalate_only, cache_aware)
SWITCH_SAVES = "switch_saves"  # cache_aware: the cheaper tier saves more than the cache lost
CACHE_HELD = "cache_held"  # cache_aware: the cache the tier holds is worth more than moving
TOOL_LOOP = "tool_loop"  # a tool result goes to the tier that made the call
LOAD_SHED = "load_shed"  # load shedding moved this one request; the session's tier is kept


@dataclass(frozen=True, slots=True)
class Move:
    tier: str
    reason: str
    record: bool = True  # False: a one-off; the session's tier stays what it was


@dataclass(frozen=True, slots=True)
class Plan:
    fresh: Move  # the store knows no tier for the session (or one no longer configured)
    by_last: Mapping[str, Move]  # the session's last tier -> this request's move


@dataclass(frozen=True, slots=True)
class CacheQuote:
    """What cache_aware prices: this request's prompt tokens, the part of them a tier that
    served the previous turn holds cached (everything up to the last assistant message), and
    the tiers' prices."""

    prompt_tokens: int
    prefix_tokens: int
    prices: Mapping[str, Price]


def _per_mtok(price: Price, name: str) -> float:
    # Cached and cache-write prices default to the input price (a tier that states neither
    # charges every prompt token as fresh input); read by name until every Price has them.
    value = getattr(price, name, None)
    return price.input_per_mtok if value is None else float(value)


def prompt_cost(quote: CacheQuote, tier: str, cached: bool) -> float:
    """USD per request of this prompt on `tier`: with its cached prefix read at the cached price
    (`cached`), or written afresh (at the cache-write price where the tier charges one)."""
    price = quote.prices[tier]
    prefix = min(quote.prefix_tokens, quote.prompt_tokens)
    rest = quote.prompt_tokens - prefix
    prefix_rate = _per_mtok(price, "cached_input_per_mtok" if cached else "cache_write_per_mtok")
    return (prefix * prefix_rate + rest * price.input_per_mtok) / 1e6


def switch_saves(quote: CacheQuote, current: str, new: str) -> bool:
    """cache_aware's rule: moving from `current` (which holds the prefix cached) to `new` (which
    does not) only when this turn's saving at fresh prices exceeds the cache given up."""
    return prompt_cost(quote, new, cached=False) < prompt_cost(quote, current, cached=True)


def plan(
    mode: Mode,
    proposal: str,
    order: Sequence[str],
    *,
    tool_loop: bool = False,
    shed: bool = False,
    cache: CacheQuote | None = None,
    policy_tiers: Collection[str] | None = None,
) -> Plan:
    """The plan for one request. `proposal`: the policy's tier; `order`: every configured tier,
    cheapest first (tiers_by_price); `tool_loop`: the request carries a tool result (and the
    session's tool_loop option is on); `shed`: load shedding chose `proposal`; `policy_tiers`:
    the tiers the deciding policy uses (default: all). A session last on a tier outside them
    (another arm's, before a reload) starts afresh, except in a tool loop: the tier that made
    the call answers its result whatever policy decides now."""
    rank = {name: i for i, name in enumerate(order)}
    mine = set(order if policy_tiers is None else policy_tiers)
    fresh = Move(proposal, LOAD_SHED if shed else NEW, record=not shed)
    by_last: dict[str, Move] = {}
    for last in order:
        if last in mine or tool_loop:
            by_last[last] = _move(mode, proposal, last, rank, tool_loop, shed, cache)
        else:
            by_last[last] = fresh
    return Plan(fresh, by_last)


def _move(
    mode: Mode,
    proposal: str,
    last: str,
    rank: Mapping[str, int],
    tool_loop: bool,
    shed: bool,
    cache: CacheQuote | None,
) -> Move:
    if tool_loop:
        return Move(last, TOOL_LOOP)
    if proposal == last:
        return Move(last, PER_REQUEST if mode == "per_request" else SAME)
    if shed:
        return Move(proposal, LOAD_SHED, record=False)
    if mode == "per_request":
        return Move(proposal, PER_REQUEST)
    if mode == "sticky":
        return Move(last, HELD)
    up = rank.get(proposal, -1) > rank.get(last, -1)
    if up:
        return Move(proposal, ESCALATED)
    if mode == "escalate_only" or cache is None:
        return Move(last, HELD)
    # cache_aware, moving to a cheaper tier
    if switch_saves(cache, last, proposal):
        return Move(proposal, SWITCH_SAVES)
    return Move(last, CACHE_HELD)
