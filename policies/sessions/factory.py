"""The one place that builds the session store: next to the budget store it shares."""

from __future__ import annotations

import time
from typing import Any

from policies.budgets.store import Clock
from policies.sessions.store import MemorySessionStore, SessionStore


def session_store(budget_store: Any, prefix: str, clock: Clock = time.time) -> SessionStore:
    """Redis (single or cluster, through the budget store's own client) when the budget store
    holds one, else in process."""
    if getattr(budget_store, "redis", None) is None:
        return MemorySessionStore(budget_store, clock)
    # Imported here: the embedded default (store: memory) never loads redis-py.
    from policies.sessions.redis import RedisSessionStore

    return RedisSessionStore(budget_store, prefix, clock)
