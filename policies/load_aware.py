"""Load shedding for the threshold policy: borderline requests avoid a queued-up large tier.

When the large tier's server reports more than `max_waiting` queued requests, a request the
threshold would send large but whose score is less than `margin` above the threshold goes to the
small tier instead. Clearly hard requests still go large: shedding only trades away the requests
where the classifier was least sure the large model was needed. Without a load reading for the
large tier (no /metrics, stale poll) the policy behaves exactly like the threshold policy.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from policies.base import Decision, RoutingContext
from policies.threshold import ThresholdPolicy


class LoadShedParams(BaseModel):
    """`load_shed:` option of a threshold policy."""

    model_config = ConfigDict(extra="forbid")
    max_waiting: float = Field(ge=0, description="large tier's queue above this sheds load")
    margin: float = Field(gt=0, le=1, description="scores in [threshold, threshold+margin) shed")


class LoadShedPolicy:
    """A ThresholdPolicy whose borderline large-tier requests move to the small tier under load."""

    def __init__(self, inner: ThresholdPolicy, max_waiting: float, margin: float) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_waiting = float(max_waiting)
        self.margin = float(margin)

    def tiers(self) -> list[str]:
        return self.inner.tiers()

    def _large_waiting(self, ctx: RoutingContext) -> float | None:
        load = ctx.load.get(self.inner.large)
        return None if load is None else load.waiting

    def decide(self, ctx: RoutingContext) -> Decision:
        decision = self.inner.decide(ctx)
        if decision.tier != self.inner.large:
            return decision
        waiting = self._large_waiting(ctx)
        if waiting is None or waiting <= self.max_waiting:
            return decision
        t = self.inner.threshold
        if ctx.score >= t + self.margin:
            return Decision(
                decision.tier,
                self.name,
                f"{decision.reason}; {self.inner.large} queue {waiting:g} > {self.max_waiting:g}"
                f" but score is not within {self.margin:g} of the threshold",
            )
        return Decision(
            self.inner.small,
            self.name,
            f"load_shed: {self.inner.large} queue {waiting:g} > {self.max_waiting:g} and score "
            f"{ctx.score:.4f} within {self.margin:g} of threshold {t:.4f}",
        )

    def decide_batch(self, scores: np.ndarray) -> np.ndarray:
        """Offline replay has no live queue: the threshold decision."""
        return self.inner.decide_batch(scores)

    def decide_batch_loaded(self, scores: np.ndarray, large_waiting: np.ndarray) -> np.ndarray:
        """decide() for many requests, each with the large tier's queue length it saw.

        NaN in `large_waiting` means no reading (no shedding), as a missing load does in decide().
        """
        s = np.asarray(scores, dtype=np.float64)
        w = np.asarray(large_waiting, dtype=np.float64)
        tiers = self.inner.decide_batch(s)
        shed = (tiers == 1) & (w > self.max_waiting) & (s < self.inner.threshold + self.margin)
        return np.where(shed, 0, tiers).astype(np.int64)
