"""Sessions in Redis or a Redis Cluster, next to the budgets of the same store.

One hash per session, `<prefix>:{<team>}:session:<key>`: the team's hash tag, as every budget
key of the team has (policies/budgets/codec.py), so a session is on the master that holds its
team's budget and its step can ride on the request's budget reserve: `step_reserving` runs
session_reserve.lua, the step and the reserve in one script and one round trip, through the
budget store's own machinery (its per-master clients on a cluster, retries, WAIT, what an outage
is, fail_mode). `step` (session.lua) is the step alone. Redis expires a session `ttl_s` after its
last request. An unreachable Redis is classified as the budget store classifies it
(policies/budgets/redis_store.py): SessionUnavailable from `step`, the budget's own outage
handling from `step_reserving`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from importlib import resources
from typing import Any

from redis.asyncio.cluster import RedisCluster

from policies.budgets.codec import TeamKeys
from policies.budgets.money import usd_to_nanos
from policies.budgets.redis_store import RedisBudgetStore, store_unavailable
from policies.budgets.scopes import BudgetScope
from policies.budgets.store import Clock
from policies.sessions.modes import Move, Plan
from policies.sessions.store import (
    ReserveOptions,
    SessionState,
    SessionStep,
    SessionUnavailable,
    StepReserved,
)


def _lua(name: str) -> str:
    return (resources.files(__package__) / f"{name}.lua").read_text(encoding="utf-8")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flag(move: Move) -> str:
    return "1" if move.record else "0"


class RedisSessionStore:
    def __init__(self, budgets: RedisBudgetStore, prefix: str, clock: Clock = time.time) -> None:
        self.budgets = budgets
        self.redis = budgets.redis
        self.prefix = prefix
        self._clock = clock
        self._script = self.redis.register_script(_lua("session_fn") + "\n" + _lua("session"))
        riding = _lua("session_fn") + "\n" + _lua("session_reserve")
        self._riding = budgets.add_reserving("session", riding)
        # A cluster client learns the slot map on first use; concurrent first uses race inside
        # redis-py, so the first call waits for it (a no-op after).
        self._unmapped = isinstance(self.redis, RedisCluster)

    def key(self, team: str, session: str) -> str:
        return f"{TeamKeys(self.prefix, team).base}:session:{session}"

    def _args(self, plan: Plan, prompt_tokens: int, ttl_s: float) -> list[Any]:
        fresh = plan.fresh
        args: list[Any] = [
            max(1, int(ttl_s * 1000)),
            f"{self._clock():.3f}",
            max(0, int(prompt_tokens)),
            fresh.tier,
            fresh.reason,
            _flag(fresh),
            len(plan.by_last),
        ]
        for last, move in plan.by_last.items():
            args += [last, move.tier, move.reason, _flag(move)]
        return args

    async def step(
        self, team: str, key: str, plan: Plan, prompt_tokens: int, ttl_s: float
    ) -> SessionStep:
        args = self._args(plan, prompt_tokens, ttl_s)
        reply = await self._call(self._script(keys=[self.key(team, key)], args=args))
        return _step(reply, float(args[1]))

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
        args = self._args(plan, prompt_tokens, ttl_s)
        now = float(args[1])
        args.append(len(options))
        for tier, option in options.items():
            if option is None:
                args += [tier, "-", 0]
            else:
                args += [tier, usd_to_nanos(option[0]), int(option[1])]
        done = await self.budgets.reserve_after(
            scope,
            request_id,
            self._riding,
            [self.key(team, key)],
            args,
            _fallback(options, plan.fresh.tier),
        )
        if done.head is None:  # unreachable, fail_mode open: admitted without the session
            return StepReserved(None, done.reservation)
        return StepReserved(_step(done.head, now), done.reservation, done.refused)

    async def load(self, team: str, key: str) -> SessionState | None:
        raw = await self._call(self.redis.hgetall(self.key(team, key)))
        if not raw:
            return None
        data = {_s(k): _s(v) for k, v in raw.items()}
        return SessionState(
            data.get("l") or None,
            [t for t in data.get("u", "").split(",") if t],
            int(data.get("p", 0)),
            int(data.get("r", 0)),
            float(data.get("s", 0)),
        )

    async def _call(self, command: Awaitable[Any]) -> Any:
        # What counts as an outage is the budget store's call (`store_unavailable`), so a
        # session and a budget check fail alike; anything else is a bug and propagates.
        try:
            if self._unmapped:
                await self.redis.initialize()
                self._unmapped = False
            return await command
        except Exception as exc:
            if not store_unavailable(exc):
                raise
            raise SessionUnavailable(f"session store unreachable: {type(exc).__name__}") from exc


def _fallback(options: ReserveOptions, fresh: str) -> tuple[float, int]:
    """What fail_mode open admits unchecked when the store cannot be reached: the policy's own
    choice (the plan's fresh move), else the largest option."""
    chosen = options.get(fresh)
    if chosen is not None:
        return chosen
    known = [o for o in options.values() if o is not None]
    return max(known) if known else (0.0, 0)


def _step(reply: Any, now: float) -> SessionStep:
    tier, reason, flag, previous, used = (_s(v) for v in reply[:5])
    record = flag == "1"
    state = SessionState(
        tier if record else (previous or None),
        [t for t in used.split(",") if t],
        int(reply[5]),
        int(reply[6]),
        now,
    )
    return SessionStep(Move(tier, reason, record), previous or None, state)
