"""`tiers`: N tiers ordered by price with N-1 ascending thresholds.

A score picks the tier whose band it falls in: below thresholds[0] -> tiers[0] (cheapest),
at or above thresholds[-1] -> tiers[-1] (priciest).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from policies.base import Decision, RoutingContext


class TiersPolicy:
    def __init__(self, name: str, tiers: Sequence[str], thresholds: Sequence[float]) -> None:
        if len(thresholds) != len(tiers) - 1:
            raise ValueError(f"{len(tiers)} tiers need {len(tiers) - 1} thresholds")
        if any(b < a for a, b in zip(thresholds, thresholds[1:], strict=False)):
            raise ValueError("thresholds must be ascending")
        self.name = name
        self._tiers = list(tiers)
        self.thresholds = [float(t) for t in thresholds]
        self._edges = np.asarray(self.thresholds, dtype=np.float64)

    def tiers(self) -> list[str]:
        return list(self._tiers)

    def decide(self, ctx: RoutingContext) -> Decision:
        # bisect_right counts thresholds <= score, i.e. `score >= t` moves up a band.
        idx = bisect.bisect_right(self.thresholds, ctx.score)
        return Decision(self._tiers[idx], self.name, f"score {ctx.score:.4f} in band {idx}")

    def decide_batch(self, scores: np.ndarray) -> np.ndarray:
        scores64 = np.asarray(scores, dtype=np.float64)
        return np.searchsorted(self._edges, scores64, side="right").astype(np.int64)
