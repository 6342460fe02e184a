"""Where a session's state lives: the contract, the in-process store, and the one factory.

A session's state is small and fixed in shape (`SessionState`: the tiers it used, its last
tier, the prompt tokens of its requests so far, when it was last seen, how many requests it
made), kept next to the budgets (memory, Redis, Redis Cluster: policies/sessions/redis.py),
shared by the replicas of a shared store and forgotten `ttl_s` after the session's last request.

`step` is the request path's only call, and one round trip: it reads the state, applies the
request's `Plan` (policies/sessions/modes.py) and writes the update, atomically.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from policies.budgets.store import Clock
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


class SessionStore(Protocol):
    async def step(self, key: str, plan: Plan, prompt_tokens: int, ttl_s: float) -> SessionStep: ...

    async def load(self, key: str) -> SessionState | None: ...


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

    def __init__(self, clock: Clock = time.time, max_sessions: int = MEMORY_MAX_SESSIONS) -> None:
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

    async def step(self, key: str, plan: Plan, prompt_tokens: int, ttl_s: float) -> SessionStep:
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

    async def load(self, key: str) -> SessionState | None:
        state = self._live(key, self._clock())
        return None if state is None else _copy(state)


def _copy(state: SessionState) -> SessionState:
    return SessionState(
        state.last_tier,
        list(state.tiers_used),
        state.prompt_tokens,
        state.requests,
        state.last_seen,
    )
