"""Everything a request needs, in one object on ``app.state.router``.

A request reads ``app.state.router`` once and uses that snapshot to the end, so a hot reload can
swap in a new RouterState atomically (one attribute assignment) without a request ever seeing
half of each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.base import Backend, TierLoad
from backends.config import TierConfig
from backends.signal_poller import SignalsPoller
from policies.keys import KeyRing
from policies.registry import build_policies
from policies.selection import PolicySelector
from router.budget_gate import BudgetGate
from router.config import RouterConfig
from router.feedback import FeedbackService
from router.metrics import RouterMetrics
from router.trace_sink import TraceSink

log = logging.getLogger(__name__)


class Scorer(Protocol):
    def score_request(self, body: Mapping[str, Any], context_turns: int | None = None) -> float: ...


class TierLimiter:
    """At most `max_inflight` upstream requests per tier; a new one waits at most
    `queue_timeout_s` for a slot, then the caller falls back (or answers 429)."""

    def __init__(self, tier: str, max_inflight: int, queue_timeout_s: float,
                 metrics: RouterMetrics) -> None:  # fmt: skip
        self._sem = asyncio.Semaphore(max_inflight)
        self._timeout = queue_timeout_s
        self._gauge = metrics.inflight.labels(tier)

    async def acquire(self) -> bool:
        if not self._sem.locked():
            await self._sem.acquire()  # a free slot: returns without suspending
        elif self._timeout <= 0:
            return False
        else:
            try:
                await asyncio.wait_for(self._sem.acquire(), self._timeout)
            except TimeoutError:
                return False
        self._gauge.inc()
        return True

    def release(self) -> None:
        self._gauge.dec()
        self._sem.release()


def build_selector(config: RouterConfig) -> PolicySelector:
    """The config's policies, built, with the routing sections that choose among them."""
    return PolicySelector(
        build_policies(config.policies, config.policy_env()),
        config.default_policy,
        tiers=config.tiers,
        teams=config.teams,
        keys=config.keys,
        experiments=config.experiments,
    )


@dataclass
class RouterState:
    config: RouterConfig
    selector: PolicySelector
    scorer: Scorer
    backends: dict[str, Backend]
    limiters: dict[str, TierLimiter]
    keys: KeyRing
    budgets: BudgetGate
    metrics: RouterMetrics
    traces: TraceSink | None
    signals: SignalsPoller | None = None
    feedback: FeedbackService | None = None  # /v1/feedback; None when traces are off
    tiers: dict[str, TierConfig] = field(default_factory=dict)
    # Settle-and-trace work that outlives its response; awaited on shutdown.
    pending: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.tiers = {t.name: t for t in self.config.tiers}

    def load(self) -> Mapping[str, TierLoad]:
        return self.signals.load() if self.signals is not None else {}

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.pending.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background request work failed", exc_info=task.exception())

    async def drain(self) -> None:
        while self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=True)
