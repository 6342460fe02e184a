"""Load shedding for the threshold policy: borderline requests avoid a queued-up large tier.

When the large tier's server reports more than `max_waiting` queued requests, a request the
threshold would send large but whose score is less than `margin` above the threshold goes to the
small tier instead. Clearly hard requests still go large: shedding only trades away the requests
where the classifier was least sure the large model was needed. Without a load reading for the
large tier (no /metrics, stale poll, NaN) the policy behaves exactly like the threshold policy.
Configured as the `load_shed:` option of a `threshold` policy (policies/threshold.py).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from policies.base import (
    NO_CONTEXT,
    BatchContext,
    Decision,
    RoutingContext,
    Tunable,
    TunableWrapper,
)


class LoadShedParams(BaseModel):
    """`load_shed:` option of a threshold policy."""

    model_config = ConfigDict(extra="forbid")
    max_waiting: float = Field(ge=0, description="large tier's queue above this sheds load")
    margin: float = Field(gt=0, le=1, description="scores in [threshold, threshold+margin) shed")


class LoadShedPolicy(TunableWrapper):
    """A threshold policy whose borderline large-tier requests move to the small tier under load.

    Tunable through its inner policy: small, large and threshold are the inner policy's, and
    with_threshold moves the inner threshold and keeps the shedding settings.
    """

    def __init__(self, inner: Tunable, max_waiting: float, margin: float) -> None:
        super().__init__(inner)
        self.max_waiting = float(max_waiting)
        self.margin = float(margin)

    @property
    def threshold(self) -> float:
        return self.inner.threshold

    def with_threshold(self, threshold: float) -> LoadShedPolicy:
        return LoadShedPolicy(self.inner.with_threshold(threshold), self.max_waiting, self.margin)

    def _large_waiting(self, ctx: RoutingContext) -> float | None:
        load = ctx.load.get(self.large)
        if load is None or load.waiting is None or math.isnan(load.waiting):
            return None
        return load.waiting

    def decide(self, ctx: RoutingContext) -> Decision:
        decision = self.inner.decide(ctx)
        if decision.tier != self.large:
            return decision
        waiting = self._large_waiting(ctx)
        if waiting is None or waiting <= self.max_waiting:
            return decision
        t = self.threshold
        if ctx.score >= t + self.margin:
            return Decision(
                decision.tier,
                self.name,
                f"{decision.reason}; {self.large} queue {waiting:g} > {self.max_waiting:g}"
                f" but score is not within {self.margin:g} of the threshold",
            )
        return Decision(
            self.small,
            self.name,
            f"load_shed: {self.large} queue {waiting:g} > {self.max_waiting:g} and score "
            f"{ctx.score:.4f} within {self.margin:g} of threshold {t:.4f}",
        )

    def decide_batch(self, scores: np.ndarray, ctx: BatchContext = NO_CONTEXT) -> np.ndarray:
        """decide() per row, each with the large tier's queue length it saw (ctx.waiting; no
        entry, as in an offline trace without signals: the threshold decision)."""
        s = np.asarray(scores, dtype=np.float64)
        w = ctx.waiting_of(self.large, len(s))
        tiers = self.inner.decide_batch(s, ctx)
        # NaN compares False: no reading, no shedding, as in decide().
        shed = (tiers == 1) & (w > self.max_waiting) & (s < self.threshold + self.margin)
        return np.where(shed, 0, tiers).astype(np.int64)
