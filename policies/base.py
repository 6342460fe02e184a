"""What every routing policy sees and returns. Shared by the proxy and the simulator."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from backends.base import TierLoad


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


@dataclass(frozen=True, slots=True)
class BatchContext:
    """What `decide_batch` may use besides the scores: the batch's share of RoutingContext.

    `units` and `waiting` are row-aligned with the scores; `budget` is one view for the batch.
    Each policy reads only what it needs, so a new context field never widens the signature.
    """

    units: Sequence[str] | None = None  # request ids (RoutingContext.unit per row)
    budget: BudgetView | None = None
    # Per tier: the queue length each row saw (NaN: no reading), as RoutingContext.load's waiting.
    waiting: Mapping[str, np.ndarray] = field(default_factory=dict)

    def waiting_of(self, tier: str, rows: int) -> np.ndarray:
        """The tier's queue length per row as float64; all NaN (no reading) without an entry."""
        if tier not in self.waiting:
            return np.full(rows, np.nan)
        w = np.asarray(self.waiting[tier], dtype=np.float64)
        if len(w) != rows:
            raise ValueError(f"{len(w)} queue readings of tier {tier!r} for {rows} scores")
        return w


NO_CONTEXT = BatchContext()


@runtime_checkable
class Policy(Protocol):
    name: str

    def decide(self, ctx: RoutingContext) -> Decision: ...

    def tiers(self) -> list[str]:
        """Tiers this policy can choose, cheapest first."""
        ...

    def decide_batch(self, scores: np.ndarray, ctx: BatchContext = NO_CONTEXT) -> np.ndarray:
        """Vectorised decide() for the simulator: index into tiers() per score. Row i decides as
        decide() would with RoutingContext(score=scores[i], unit=ctx.units[i], budget=ctx.budget,
        load={tier: TierLoad(waiting=w[i]) for tier, w in ctx.waiting.items()}); without units
        the row numbers ("0", "1", ...) stand in. A NaN queue length is no reading, in both.
        tests/policies/test_policy_conformance.py checks this for every registered type."""
        ...


@runtime_checkable
class Tunable(Policy, Protocol):
    """A policy with one score threshold between a small and a large tier: what `tune` sweeps and
    budget pacing moves. Wrappers (load shedding) expose their inner policy's threshold.

    tiers() is [small, large]; `isinstance(p, Tunable)` is the check, never a list of classes.
    """

    small: str
    large: str
    threshold: float

    def with_threshold(self, threshold: float) -> Tunable:
        """The same policy at another threshold (every other setting kept)."""
        ...


class TunableWrapper:
    """What a wrapper of a Tunable (load shedding, calibration) passes through unchanged: its
    name, tiers and tier names. Subclasses say where the threshold comes from."""

    def __init__(self, inner: Tunable) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def small(self) -> str:
        return self.inner.small

    @property
    def large(self) -> str:
        return self.inner.large

    def tiers(self) -> list[str]:
        return self.inner.tiers()
