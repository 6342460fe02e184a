"""`budget_pacing`: a threshold that rises smoothly when a team spends faster than its period.

Pace ratio r = (remaining budget fraction) / (remaining period fraction). r >= 1: the team is on
or under pace and gets the base threshold. As r falls below 1 the threshold climbs smoothly
(smoothstep) and reaches `max_threshold` at r = 1 - slack. Because the threshold is at its
maximum whenever r <= 1 - slack, the remaining budget stays above (1 - slack) x the remaining
period's share of it, so (as long as the small tier alone fits the budget's rate) the budget lasts
the whole period instead of running out early. `reserve` (a fraction of the limit, default 2%)
counts as already spent, so the last requests of a period, each charged whole, fit too.

A `total` budget has no period (BudgetView.period_elapsed is always 0), so there is no pace to
keep: the threshold instead rises as the remaining fraction falls from `slack` to 0.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from policies.base import NO_CONTEXT, BatchContext, BudgetView, Decision, RoutingContext
from policies.spec import Builder, PolicySpec, TwoTierParams


def usable_fraction(budget: BudgetView, reserve: float) -> float:
    """Remaining budget fraction, less a reserve kept back for request granularity at the end."""
    assert budget.limit_usd
    left = (budget.remaining_usd or 0.0) / budget.limit_usd
    return max(0.0, (left - reserve) / (1.0 - reserve))


def pace_ratio(budget: BudgetView, reserve: float = 0.0) -> float:
    """Usable budget fraction over remaining period fraction (inf: no limit or period over)."""
    if budget.limit_usd is None:
        return float("inf")
    if budget.limit_usd <= 0:
        return 0.0
    remaining = usable_fraction(budget, reserve)
    time_left = 1.0 - min(max(budget.period_elapsed, 0.0), 1.0)
    if time_left <= 0.0:
        return float("inf") if remaining > 0 else 0.0
    return remaining / time_left


class BudgetPacingPolicy:
    def __init__(
        self,
        name: str,
        small: str,
        large: str,
        threshold: float,
        max_threshold: float = 1.0,
        slack: float = 0.2,
        reserve: float = 0.02,
    ) -> None:
        if max_threshold < threshold:
            raise ValueError("max_threshold must be >= threshold")
        if not 0 < slack <= 1:
            raise ValueError("slack must be in (0, 1]")
        if not 0 <= reserve < 1:
            raise ValueError("reserve must be in [0, 1)")
        self.name = name
        self.small = small
        self.large = large
        self.threshold = float(threshold)
        self.max_threshold = float(max_threshold)
        self.slack = float(slack)
        self.reserve = float(reserve)

    def tiers(self) -> list[str]:
        return [self.small, self.large]

    def with_threshold(self, threshold: float) -> BudgetPacingPolicy:
        """At another base threshold; the ceiling rises to a base above it (never below it)."""
        top = max(self.max_threshold, float(threshold))
        return BudgetPacingPolicy(
            self.name, self.small, self.large, threshold, top, self.slack, self.reserve
        )

    def effective_threshold(self, budget: BudgetView | None) -> float:
        if budget is None:
            return self.threshold
        if budget.period_elapsed <= 0.0 and budget.limit_usd:
            behind = (self.slack - usable_fraction(budget, self.reserve)) / self.slack
        else:
            behind = (1.0 - pace_ratio(budget, self.reserve)) / self.slack
        g = min(max(behind, 0.0), 1.0)
        smooth = g * g * (3.0 - 2.0 * g)
        return self.threshold + (self.max_threshold - self.threshold) * smooth

    def decide(self, ctx: RoutingContext) -> Decision:
        t = self.effective_threshold(ctx.budget)
        tier = self.large if ctx.score >= t else self.small
        op = ">=" if tier == self.large else "<"
        return Decision(tier, self.name, f"score {ctx.score:.4f} {op} paced threshold {t:.4f}")

    def decide_batch(self, scores: np.ndarray, ctx: BatchContext = NO_CONTEXT) -> np.ndarray:
        """All scores decided under the batch's one budget view (None: the base threshold)."""
        t = self.effective_threshold(ctx.budget)
        return (np.asarray(scores, dtype=np.float64) >= t).astype(np.int64)


class BudgetPacingParams(TwoTierParams):
    max_threshold: float = Field(default=1.0, ge=0, le=1)
    slack: float = Field(default=0.2, gt=0, le=1)
    reserve: float = Field(default=0.02, ge=0, lt=1, description="share of the limit kept back")


def build(b: Builder, p: BudgetPacingParams) -> BudgetPacingPolicy:
    small, large = b.two_tiers(p.small, p.large)
    t = b.threshold(p)
    if p.max_threshold < t:
        raise b.error("max_threshold", f"must be >= threshold ({t:.4f})")
    return BudgetPacingPolicy(b.name, small, large, t, p.max_threshold, p.slack, p.reserve)


SPEC = PolicySpec(BudgetPacingParams, build)
