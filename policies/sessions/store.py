"""Where a session's state lives: the contract, the in-process store, and the one factory.

A session's state is small and fixed in shape (`SessionState`: the tiers it used, its last
tier, the prompt tokens of its requests so far, when it was last seen, how many requests it
made), kept next to the budgets (memory, Redis, Redis Cluster: policies/sessions/redis.py),
shared by the replicas of a shared store and forgotten `ttl_s` after the session's last request.

`step` reads the state, applies the request's `Plan` (policies/sessions/modes.py) and writes the
update, atomically, in one round trip. The request path calls `step_reserving`: the step and then
the request's budget reserve of the amount the step's tier needs, which a store next to the
budgets runs as one round trip (policies/sessions/redis.py) and the in-process store as the two
calls in turn (`step_then_reserve`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from policies.budgets.scopes import BudgetScope
from policies.budgets.store import BudgetExceeded, BudgetStore, Clock, Reservation
from policies.sessions.modes import Move, Plan

# The in-process store forgets the least recently seen sessions beyond this many (a bound on
# its memory whatever the traffic: ~200 bytes a session).
MEMORY_MAX_SESSIONS = 200_000


class SessionUnavailable(Exception):
    """The session store cannot be reached: the request fails as a budget check would
    (budgets.fail_mode: closed -> 503, open -> decided without the session)."""


@dataclass(slots=True)
class SessionState:
    last_tier: str | None = None
    tiers_used: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    requests: int = 0
    last_seen: float = 0.0


@dataclass(frozen=True, slots=True)
class SessionStep:
    """What `step` did: the move taken, and the session's state after it."""

    move: Move
    previous_tier: str | None  # the session's last tier before this request (None: new)
    state: SessionState


# What the request reserves when the step sends it to each tier: (worst-case USD, tokens), or
# None where it cannot go (no context window holds it from there: it is refused, nothing held).
ReserveOptions = Mapping[str, tuple[float, int] | None]


@dataclass(frozen=True, slots=True)
class StepReserved:
    """What `step_reserving` did. `step` None: the store could not be reached and fail_mode open
    admitted the request without its session (`reservation` is then the unchecked one). Else the
    reservation of the step's tier's option, None when it has none or the budget refused it
    (`refused`: the request path tries its other options, as for any refusal)."""

    step: SessionStep | None
    reservation: Reservation | None
    refused: BudgetExceeded | None = None


class SessionStore(Protocol):
    async def step(
        self, team: str, key: str, plan: Plan, prompt_tokens: int, ttl_s: float
    ) -> SessionStep: ...

    async def step_reserving(
        self,
        team: str,
        key: str,
        plan: Plan,
        prompt_tokens: int,
        ttl_s: float,
        scope: BudgetScope,
        request_id: str,
        options: ReserveOptions,
    ) -> StepReserved: ...

    async def load(self, team: str, key: str) -> SessionState | None: ...


async def step_then_reserve(
    store: SessionStore,
    budgets: BudgetStore,
    team: str,
    key: str,
    plan: Plan,
    prompt_tokens: int,
    ttl_s: float,
    scope: BudgetScope,
    request_id: str,
    options: ReserveOptions,
) -> StepReserved:
    """`step_reserving` as two calls: for a store that is not next to the budgets."""
    step = await store.step(team, key, plan, prompt_tokens, ttl_s)
    option = options.get(step.move.tier)
    if option is None:
        return StepReserved(step, None)
    try:
        reservation = await budgets.reserve(scope, request_id, option[0], option[1])
    except BudgetExceeded as exc:
        return StepReserved(step, None, exc)
    return StepReserved(step, reservation)


def choose(plan: Plan, last: str | None) -> Move:
    """The plan's move for a session whose last tier is `last` (session.lua does the same)."""
    if last is None:
        return plan.fresh
    return plan.by_last.get(last, plan.fresh)


def apply(state: SessionState, move: Move, prompt_tokens: int, now: float) -> None:
    """The update `step` makes (session.lua does the same)."""
    if move.record:
        state.last_tier = move.tier
        if move.tier not in state.tiers_used:
            state.tiers_used.append(move.tier)
    state.prompt_tokens += prompt_tokens
    state.requests += 1
    state.last_seen = now


class MemorySessionStore:
    """Sessions in this process (budgets.store: memory): one replica's, lost on restart."""

    def __init__(
        self,
        budgets: BudgetStore | None = None,
        clock: Clock = time.time,
        max_sessions: int = MEMORY_MAX_SESSIONS,
    ) -> None:
        self.budgets = budgets  # what step_reserving reserves on (None: no budgets to reserve)
        self._clock = clock
        self._max = max_sessions
        self._sessions: OrderedDict[str, tuple[float, SessionState]] = OrderedDict()

    def _live(self, key: str, now: float) -> SessionState | None:
        hit = self._sessions.get(key)
        if hit is None:
            return None
        if hit[0] <= now:
            del self._sessions[key]
            return None
        return hit[1]

    async def step(
        self, team: str, key: str, plan: Plan, prompt_tokens: int, ttl_s: float
    ) -> SessionStep:
        key = f"{team}\x00{key}"
        now = self._clock()
        state = self._live(key, now)
        previous = state.last_tier if state is not None else None
        move = choose(plan, previous)
        state = state or SessionState()
        apply(state, move, prompt_tokens, now)
        self._sessions[key] = (now + ttl_s, state)
        self._sessions.move_to_end(key)
        while len(self._sessions) > self._max:
            self._sessions.popitem(last=False)
        return SessionStep(move, previous, _copy(state))

    async def step_reserving(
        self,
        team: str,
        key: str,
        plan: Plan,
        prompt_tokens: int,
        ttl_s: float,
        scope: BudgetScope,
        request_id: str,
        options: ReserveOptions,
    ) -> StepReserved:
        if self.budgets is None:
            raise RuntimeError("this session store was built without the budget store")
        return await step_then_reserve(
            self, self.budgets, team, key, plan, prompt_tokens, ttl_s, scope, request_id, options
        )

    async def load(self, team: str, key: str) -> SessionState | None:
        state = self._live(f"{team}\x00{key}", self._clock())
        return None if state is None else _copy(state)


def _copy(state: SessionState) -> SessionState:
    return SessionState(
        state.last_tier,
        list(state.tiers_used),
        state.prompt_tokens,
        state.requests,
        state.last_seen,
    )
