"""What every routing policy sees and returns. Shared by the proxy and the simulator."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class BudgetView:
    """A team's budget as the policy sees it at decision time."""

    limit_usd: float | None
    spent_usd: float
    reserved_usd: float
    period_elapsed: float  # fraction of the current period gone, 0..1 (0 for 'total')

    @property
    def remaining_usd(self) -> float | None:
        if self.limit_usd is None:
            return None
        return max(0.0, self.limit_usd - self.spent_usd - self.reserved_usd)


@dataclass(frozen=True, slots=True)
class TierLoad:
    """Live load of one tier's backend (from its /metrics, when it has one)."""

    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    spec_acceptance: float | None = None


@dataclass(frozen=True, slots=True)
class RoutingContext:
    score: float
    team: str | None = None
    budget: BudgetView | None = None
    load: Mapping[str, TierLoad] = field(default_factory=dict)
    now: float = 0.0
    unit: str | None = None  # deterministic seed for randomised policies (request id)


@dataclass(frozen=True, slots=True)
class Decision:
    tier: str
    policy: str
    reason: str = ""


@runtime_checkable
class Policy(Protocol):
    name: str

    def decide(self, ctx: RoutingContext) -> Decision: ...

    def tiers(self) -> list[str]:
        """Tiers this policy can choose, cheapest first."""
        ...

    def decide_batch(self, scores: np.ndarray) -> np.ndarray:
        """Vectorised decide() for the simulator: index into tiers() per score."""
        ...
