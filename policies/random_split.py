"""`random`: large with probability p, whatever the score. A baseline for experiments.

The draw is a hash of (seed, unit), where the unit is the request id, so a replayed trace gets
the same draws as the live proxy did and decide_batch agrees with decide exactly.
"""

from __future__ import annotations

import secrets

import numpy as np
from pydantic import Field

from policies.base import NO_CONTEXT, BatchContext, Decision, RoutingContext
from policies.hashing import unit_uniform
from policies.spec import Builder, PolicyParams, PolicySpec


class RandomPolicy:
    def __init__(self, name: str, small: str, large: str, p: float, seed: str = "") -> None:
        self.name = name
        self.small = small
        self.large = large
        self.p = float(p)
        self.seed = seed or name

    def tiers(self) -> list[str]:
        return [self.small, self.large]

    def _draw(self, unit: str | None) -> float:
        if unit is None:
            # No request id: an unseeded draw; such decisions cannot be replayed exactly.
            return secrets.randbits(53) / float(2**53)
        return unit_uniform(self.seed, unit)

    def decide(self, ctx: RoutingContext) -> Decision:
        u = self._draw(ctx.unit)
        tier = self.large if u < self.p else self.small
        return Decision(tier, self.name, f"draw {u:.4f} vs p {self.p:.4f}")

    def decide_batch(self, scores: np.ndarray, ctx: BatchContext = NO_CONTEXT) -> np.ndarray:
        """ctx.units: the request ids (as in RoutingContext.unit); default: row numbers."""
        n = len(np.asarray(scores))
        ids = ctx.units if ctx.units is not None else [str(i) for i in range(n)]
        if len(ids) != n:
            raise ValueError(f"{len(ids)} units for {n} scores")
        draws = np.fromiter((unit_uniform(self.seed, u) for u in ids), dtype=np.float64, count=n)
        return (draws < self.p).astype(np.int64)


class RandomParams(PolicyParams):
    small: str | None = None
    large: str | None = None
    p: float = Field(ge=0, le=1, description="probability of the large tier")
    seed: str = ""


def build(b: Builder, p: RandomParams) -> RandomPolicy:
    return RandomPolicy(b.name, *b.two_tiers(p.small, p.large), p.p, p.seed)


SPEC = PolicySpec(RandomParams, build)
