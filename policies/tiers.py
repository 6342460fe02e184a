"""`tiers`: N tiers ordered by price with N-1 ascending thresholds.

A score picks the tier whose band it falls in: below thresholds[0] -> tiers[0] (cheapest),
at or above thresholds[-1] -> tiers[-1] (priciest).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
from pydantic import Field, model_validator

from policies.base import NO_CONTEXT, BatchContext, Decision, RoutingContext
from policies.spec import Builder, PolicySpec, ShareSource, price_rank
from policies.target_share import convert_share


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

    def decide_batch(self, scores: np.ndarray, ctx: BatchContext = NO_CONTEXT) -> np.ndarray:
        scores64 = np.asarray(scores, dtype=np.float64)
        return np.searchsorted(self._edges, scores64, side="right").astype(np.int64)


class TiersParams(ShareSource):
    tiers: list[str] | None = Field(default=None, description="cheapest first; default: all")
    thresholds: list[float] | None = None
    target_shares: list[float] | None = Field(
        default=None, description="share of traffic at or above each band, descending"
    )

    @model_validator(mode="after")
    def _bands(self) -> TiersParams:
        if (self.thresholds is None) == (self.target_shares is None):
            raise ValueError("give exactly one of thresholds or target_shares")
        values = self.thresholds if self.thresholds is not None else self.target_shares or []
        if any(not 0 <= v <= 1 for v in values):
            raise ValueError("thresholds and target_shares must be in [0, 1]")
        if self.thresholds is not None and values != sorted(values):
            raise ValueError("thresholds must be ascending")
        if self.target_shares is not None:
            if values != sorted(values, reverse=True):
                raise ValueError("target_shares must be descending")
            if not self.reference_trace:
                raise ValueError("target_shares needs reference_trace")
        return self


def build(b: Builder, p: TiersParams) -> TiersPolicy:
    names = p.tiers or b.by_price
    unknown = [n for n in names if n not in b.by_price]
    if unknown:
        raise b.error("tiers", f"unknown tiers {unknown}")
    if len(names) < 2:
        raise b.error("tiers", "needs at least 2 tiers")
    prices = [price_rank(b.env.prices[n]) for n in names]
    if prices != sorted(prices):
        raise b.error("tiers", "must be ordered cheapest first by price")
    bands = p.thresholds if p.thresholds is not None else p.target_shares or []
    if len(bands) != len(names) - 1:
        key = "thresholds" if p.thresholds is not None else "target_shares"
        raise b.error(key, f"{len(names)} tiers need {len(names) - 1}")
    if p.target_shares is not None:
        scores, source = b.scores(p)
        bands = [
            convert_share(f"{b.name}[{i}]", s, scores, source)
            for i, s in enumerate(p.target_shares)
        ]
    return TiersPolicy(b.name, names, bands)


SPEC = PolicySpec(TiersParams, build)
