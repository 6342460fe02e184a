"""`fixed`: always one tier. The control arm of an experiment, or a pinned team."""

from __future__ import annotations

import numpy as np

from policies.base import Decision, RoutingContext


class FixedPolicy:
    def __init__(self, name: str, tier: str) -> None:
        self.name = name
        self.tier = tier

    def tiers(self) -> list[str]:
        return [self.tier]

    def decide(self, ctx: RoutingContext) -> Decision:
        return Decision(self.tier, self.name, "fixed")

    def decide_batch(self, scores: np.ndarray) -> np.ndarray:
        return np.zeros(len(np.asarray(scores)), dtype=np.int64)
