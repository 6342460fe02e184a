"""Sessions in Redis or a Redis Cluster, through the budget store's own client.

One hash per session, `<prefix>:session:{<key>}` (the hash tag puts a session in one slot, so
session.lua runs on the one master that owns it), stepped by session.lua in one round trip and
expired by Redis `ttl_s` after the session's last request. An unreachable Redis is classified
as the budget store classifies it (policies/budgets/redis_store.py) and raised as
SessionUnavailable: the request path fails it as it fails a budget check.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from importlib import resources
from typing import Any

from redis.asyncio.cluster import RedisCluster

from policies.budgets.redis_store import store_unavailable
from policies.budgets.store import Clock
from policies.sessions.modes import Move, Plan
from policies.sessions.store import SessionState, SessionStep, SessionUnavailable


def _lua() -> str:
    return (resources.files(__package__) / "session.lua").read_text(encoding="utf-8")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flag(move: Move) -> str:
    return "1" if move.record else "0"


class RedisSessionStore:
    def __init__(self, client: Any, prefix: str, clock: Clock = time.time) -> None:
        self.redis = client
        self.prefix = prefix
        self._clock = clock
        self._script = client.register_script(_lua())
        # A cluster client learns the slot map on first use; concurrent first uses race inside
        # redis-py, so the first call waits for it (a no-op after).
        self._unmapped = isinstance(client, RedisCluster)

    def key(self, session: str) -> str:
        return f"{self.prefix}:session:{{{session}}}"

    async def step(self, key: str, plan: Plan, prompt_tokens: int, ttl_s: float) -> SessionStep:
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
        reply = await self._run(keys=[self.key(key)], args=args)
        tier, reason, flag, previous, used = (_s(v) for v in reply[:5])
        record = flag == "1"
        state = SessionState(
            tier if record else (previous or None),
            [t for t in used.split(",") if t],
            int(reply[5]),
            int(reply[6]),
            float(args[1]),
        )
        return SessionStep(Move(tier, reason, record), previous or None, state)

    async def load(self, key: str) -> SessionState | None:
        raw = await self._call(self.redis.hgetall(self.key(key)))
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

    async def _run(self, keys: list[str], args: list[Any]) -> Any:
        return await self._call(self._script(keys=keys, args=args))

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
