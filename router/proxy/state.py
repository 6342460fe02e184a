"""Everything a request needs, in one object on ``app.state.router``.

A request reads ``app.state.router`` once and uses that snapshot to the end, so a hot reload can
swap in a new RouterState atomically (one attribute assignment) without a request ever seeing
half of each: in-flight requests keep the policies, thresholds and classifier models they started
with. router/proxy/build.py builds it, at startup and on a reload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.base import Backend, TierLoad
from backends.config import TierConfig
from backends.deployments import DeploymentSet
from backends.signal_poller import SignalsPoller
from policies.keys import KeyRing
from policies.selection import PolicySelector
from policies.sessions.store import MemorySessionStore, SessionStore
from router.config import RouterConfig
from router.learning.feedback import FeedbackService
from router.learning.shadow import ShadowDeps, ShadowService
from router.observability.drift_monitor import DriftMonitor
from router.observability.metrics import RouterMetrics
from router.observability.telemetry_config import CallTracer
from router.observability.trace_sink import TraceSink
from router.proxy.budget_gate import BudgetGate
from router.proxy.limiter import TierLimiter
from router.proxy.score_batch import ScoreBatcher
from router.proxy.scorers import Scorer, Scorers

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The few settings a request reads, out of the whole config."""

    max_body_bytes: int  # server.max_body_bytes
    include_prompt: bool  # traces.include_prompt
    context_turns: int | None  # classifier.context_turns

    @classmethod
    def of(cls, config: RouterConfig) -> RequestLimits:
        return cls(
            config.server.max_body_bytes,
            config.traces.include_prompt,
            config.classifier.context_turns,
        )


@dataclass
class RouterState:
    config: RouterConfig
    limits: RequestLimits
    selector: PolicySelector
    scorers: Scorers
    tiers: Mapping[str, TierConfig]  # config.tiers_by_name
    backends: dict[str, Backend]
    limiters: dict[str, TierLimiter]
    keys: KeyRing
    budgets: BudgetGate
    metrics: RouterMetrics
    traces: TraceSink | None
    shadow_deps: ShadowDeps  # what a reload that turns evaluation on builds the service with
    signals: SignalsPoller | None = None
    feedback: FeedbackService | None = None  # /v1/feedback; None when traces are off
    shadow: ShadowService | None = None  # shadow comparisons; None when evaluation is off
    drift: DriftMonitor | None = None  # live drift gauges and the calibrators' pushes
    telemetry: CallTracer | None = None  # OpenTelemetry spans; None when telemetry is off
    # Tiers that balance several deployments: their load comes from the deployments' probes.
    balanced: dict[str, DeploymentSet] = field(default_factory=dict)
    # Conversations' state, next to the budgets (policies/sessions/; kept across reloads).
    sessions: SessionStore = field(default_factory=MemorySessionStore)
    score_batch: ScoreBatcher = field(default_factory=ScoreBatcher)  # the scoring step
    # Settle-and-trace work that outlives its response; awaited on shutdown.
    pending: set[asyncio.Task[None]] = field(default_factory=set)

    def scorer_for(self, policy: str | None) -> Scorer:
        """The classifier a policy scores with: its own `model_path`, else the global one."""
        return self.scorers.for_policy(policy)

    def load(self) -> Mapping[str, TierLoad]:
        polled = self.signals.load() if self.signals is not None else {}
        if not self.balanced:
            return polled
        own = {t: s.tier_load for t, s in self.balanced.items() if s.tier_load is not None}
        return {**polled, **own} if own else polled

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
