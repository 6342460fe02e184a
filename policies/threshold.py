"""`threshold`: score >= t goes to the large tier, everything else to the small one."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from policies.base import NO_CONTEXT, BatchContext, Decision, RoutingContext
from policies.load_shed import LoadShedParams, LoadShedPolicy
from policies.spec import Builder, PolicySpec, TwoTierParams


class ThresholdPolicy:
    """Two tiers split by one threshold on the classifier score.

    A threshold above 1 sends everything small; 0 sends everything large.
    """

    def __init__(self, name: str, small: str, large: str, threshold: float) -> None:
        self.name = name
        self.small = small
        self.large = large
        self.threshold = float(threshold)

    def tiers(self) -> list[str]:
        return [self.small, self.large]

    def with_threshold(self, threshold: float) -> ThresholdPolicy:
        return ThresholdPolicy(self.name, self.small, self.large, threshold)

    def decide(self, ctx: RoutingContext) -> Decision:
        if ctx.score >= self.threshold:
            return Decision(self.large, self.name, f"score {ctx.score:.4f} >= {self.threshold:.4f}")
        return Decision(self.small, self.name, f"score {ctx.score:.4f} < {self.threshold:.4f}")

    def decide_batch(self, scores: np.ndarray, ctx: BatchContext = NO_CONTEXT) -> np.ndarray:
        # float64 comparison, as decide() compares Python floats: the two always agree.
        return (np.asarray(scores, dtype=np.float64) >= self.threshold).astype(np.int64)


class ThresholdParams(TwoTierParams):
    load_shed: LoadShedParams | None = Field(
        default=None, description="send borderline requests small while the large tier queues"
    )


def build(b: Builder, p: ThresholdParams) -> ThresholdPolicy | LoadShedPolicy:
    policy = ThresholdPolicy(b.name, *b.two_tiers(p.small, p.large), b.threshold(p))
    if p.load_shed is None:
        return policy
    return LoadShedPolicy(policy, p.load_shed.max_waiting, p.load_shed.margin)


SPEC = PolicySpec(ThresholdParams, build)
