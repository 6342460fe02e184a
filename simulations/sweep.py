"""Vectorised threshold sweep for two-tier routing: cost-quality curve, Pareto frontier, APGR.

Routing rule (the threshold policy's): score >= t goes to the large tier. Sorting the scores once
turns every threshold into a split point, so T thresholds cost O(n log n + T log n), not O(n T).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class SweepError(ValueError):
    """Inputs the sweep cannot use; the message says which."""


@dataclass(frozen=True, slots=True)
class SweepInputs:
    scores: np.ndarray  # float64, classifier score per request
    quality_small: np.ndarray  # outcome if served by the small tier
    quality_large: np.ndarray
    cost_small: np.ndarray  # USD if served by the small tier
    cost_large: np.ndarray

    def __post_init__(self) -> None:
        n = self.scores.shape[0]
        for name in ("quality_small", "quality_large", "cost_small", "cost_large"):
            if getattr(self, name).shape != (n,):
                raise SweepError(f"{name} has shape {getattr(self, name).shape}, expected ({n},)")
        if n == 0:
            raise SweepError("no requests to sweep")


@dataclass(frozen=True, slots=True)
class SweepResult:
    thresholds: np.ndarray
    large_share: np.ndarray
    quality: np.ndarray  # mean quality per request
    cost_per_1k: np.ndarray  # USD per 1,000 requests
    quality_small: float  # all-small baseline
    quality_large: float  # all-large baseline
    cost_small_per_1k: float
    cost_large_per_1k: float

    @property
    def quality_ratio(self) -> np.ndarray:
        """Quality as a fraction of all-large quality."""
        return self.quality / self.quality_large if self.quality_large > 0 else self.quality * 0

    @property
    def pgr(self) -> np.ndarray:
        """Performance gap recovered: (quality - small) / (large - small)."""
        gap = self.quality_large - self.quality_small
        return (
            (self.quality - self.quality_small) / gap
            if gap != 0
            else np.full_like(self.quality, np.nan)
        )

    def rows(self) -> list[dict[str, float]]:
        return [
            {
                "threshold": float(t),
                "large_share": float(s),
                "quality": float(q),
                "quality_ratio": float(r),
                "cost_per_1k": float(c),
                "pgr": float(g),
            }
            for t, s, q, r, c, g in zip(
                self.thresholds,
                self.large_share,
                self.quality,
                self.quality_ratio,
                self.cost_per_1k,
                self.pgr,
                strict=True,
            )
        ]


def default_thresholds(n: int = 201) -> np.ndarray:
    return np.linspace(0.0, 1.0, n)


@dataclass(frozen=True, slots=True)
class SortedInputs:
    """Cumulative sums over requests sorted by score; shared by the sweep and the bootstrap."""

    sorted_scores: np.ndarray
    cum_q_small: np.ndarray  # length n+1: sum over the i lowest-scored requests
    cum_q_large: np.ndarray
    cum_c_small: np.ndarray
    cum_c_large: np.ndarray

    @classmethod
    def build(cls, inputs: SweepInputs) -> SortedInputs:
        order = np.argsort(inputs.scores, kind="stable")

        def cum(x: np.ndarray) -> np.ndarray:
            out = np.empty(x.shape[0] + 1)
            out[0] = 0.0
            np.cumsum(x[order], out=out[1:])
            return out

        return cls(
            sorted_scores=np.asarray(inputs.scores, dtype=np.float64)[order],
            cum_q_small=cum(inputs.quality_small),
            cum_q_large=cum(inputs.quality_large),
            cum_c_small=cum(inputs.cost_small),
            cum_c_large=cum(inputs.cost_large),
        )

    def split_points(self, thresholds: np.ndarray) -> np.ndarray:
        """Index of the first request routed large (score >= t) for each threshold."""
        return np.searchsorted(self.sorted_scores, np.asarray(thresholds, dtype=np.float64), "left")

    def sums_at(self, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per threshold: split index, total quality and total cost of the routed requests."""
        n = self.sorted_scores.shape[0]
        i = self.split_points(thresholds)
        q = self.cum_q_small[i] + (self.cum_q_large[n] - self.cum_q_large[i])
        c = self.cum_c_small[i] + (self.cum_c_large[n] - self.cum_c_large[i])
        return i, q, c


def sweep(inputs: SweepInputs, thresholds: np.ndarray | None = None) -> SweepResult:
    th = default_thresholds() if thresholds is None else np.asarray(thresholds, dtype=np.float64)
    if np.isnan(inputs.quality_small).any() or np.isnan(inputs.quality_large).any():
        raise SweepError("every request needs an outcome for both tiers to sweep thresholds")
    s = SortedInputs.build(inputs)
    n = s.sorted_scores.shape[0]
    i, q, c = s.sums_at(th)
    return SweepResult(
        thresholds=th,
        large_share=(n - i) / n,
        quality=q / n,
        cost_per_1k=c / n * 1000.0,
        quality_small=float(s.cum_q_small[n] / n),
        quality_large=float(s.cum_q_large[n] / n),
        cost_small_per_1k=float(s.cum_c_small[n] / n * 1000.0),
        cost_large_per_1k=float(s.cum_c_large[n] / n * 1000.0),
    )


def pareto_front(cost: np.ndarray, quality: np.ndarray) -> np.ndarray:
    """Indices of points no other point beats on both cost (lower) and quality (higher).

    Returned cheapest first; of equal-cost points only the best quality is kept.
    """
    order = np.lexsort((-quality, cost))  # by cost, then best quality first
    best = -np.inf
    keep: list[int] = []
    for idx in order.tolist():
        if quality[idx] > best:
            keep.append(idx)
            best = quality[idx]
    return np.asarray(keep, dtype=np.int64)
