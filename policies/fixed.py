"""`fixed`: always one tier. The control arm of an experiment, or a pinned team."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from policies.base import NO_CONTEXT, BatchContext, Decision, RoutingContext
from policies.spec import Builder, PolicyParams, PolicySpec


class FixedPolicy:
    def __init__(self, name: str, tier: str) -> None:
        self.name = name
        self.tier = tier

    def tiers(self) -> list[str]:
        return [self.tier]

    def decide(self, ctx: RoutingContext) -> Decision:
        return Decision(self.tier, self.name, "fixed")

    def decide_batch(self, scores: np.ndarray, ctx: BatchContext = NO_CONTEXT) -> np.ndarray:
        return np.zeros(len(np.asarray(scores)), dtype=np.int64)


class FixedParams(PolicyParams):
    tier: str | None = Field(default=None, description="default: the cheapest tier")


def build(b: Builder, p: FixedParams) -> FixedPolicy:
    if p.tier is not None and p.tier not in b.by_price:
        raise b.error("tier", f"unknown tier {p.tier!r}")
    return FixedPolicy(b.name, p.tier or b.by_price[0])


SPEC = PolicySpec(FixedParams, build)
