"""`threshold`: score >= t goes to the large tier, everything else to the small one."""

from __future__ import annotations

import numpy as np

from policies.base import Decision, RoutingContext


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

    def decide(self, ctx: RoutingContext) -> Decision:
        if ctx.score >= self.threshold:
            return Decision(self.large, self.name, f"score {ctx.score:.4f} >= {self.threshold:.4f}")
        return Decision(self.small, self.name, f"score {ctx.score:.4f} < {self.threshold:.4f}")

    def decide_batch(self, scores: np.ndarray) -> np.ndarray:
        # float64 comparison, as decide() compares Python floats: the two always agree.
        return (np.asarray(scores, dtype=np.float64) >= self.threshold).astype(np.int64)
