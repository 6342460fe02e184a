"""Routing quality of a score: AUC, APGR, CPT(50%), CPT(80%), bootstrap intervals, random baseline.

RouteLLM's definitions (arXiv 2406.18665; the shared data's README.md): sort prompts by
score, send the top fraction c to the large model and the rest to the small one; quality(c) is the
mean outcome of the model each prompt went to; PGR(c) = (quality(c) - small) / (large - small);
APGR is the area under PGR over c in [0, 1] (every c = k/n, trapezoids); CPT(x) is the smallest c
with PGR(c) >= x. Tied scores are treated as a random order among the tied prompts (their expected
curve), so a constant score is exactly the random router (APGR 0.5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from classifiers.labels import needs_large

Metric = Callable[[np.ndarray, np.ndarray, np.ndarray], float]


def pgr_curve(scores: np.ndarray, small: np.ndarray, large: np.ndarray) -> np.ndarray:
    """PGR at c = k/n for k = 0..n (length n + 1); NaN everywhere if large == small on average."""
    scores = np.asarray(scores, dtype=np.float64)
    small = np.asarray(small, dtype=np.float64)
    large = np.asarray(large, dtype=np.float64)
    n = len(scores)
    order = np.argsort(-scores, kind="stable")
    gain = (large - small)[order]
    sorted_scores = scores[order]
    # Ties: every prompt in a tied group gets the group's mean gain (expected value of any order).
    _, starts, counts = np.unique(-sorted_scores, return_index=True, return_counts=True)
    group_sums = np.add.reduceat(gain, starts) if n else gain
    gain = np.repeat(group_sums / counts, counts)
    small_mean, large_mean = small.mean(), large.mean()
    quality = small_mean + np.concatenate([[0.0], np.cumsum(gain)]) / max(n, 1)
    spread = large_mean - small_mean
    if n == 0 or spread == 0:
        return np.full(n + 1, np.nan)
    return (quality - small_mean) / spread


def apgr(scores: np.ndarray, small: np.ndarray, large: np.ndarray) -> float:
    curve = pgr_curve(scores, small, large)
    n = len(curve) - 1
    # Trapezoids over c = k/n.
    return float((curve[:-1] + curve[1:]).sum() / (2 * n)) if n else float("nan")


def cpt(scores: np.ndarray, small: np.ndarray, large: np.ndarray, target: float) -> float:
    """Smallest fraction of prompts sent to the large model that reaches PGR >= target."""
    curve = pgr_curve(scores, small, large)
    reached = np.flatnonzero(curve >= target - 1e-12)
    return float(reached[0] / (len(curve) - 1)) if len(reached) else float("nan")


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC via ranks (ties count half); NaN when only one class is present."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    pos, neg = labels.sum(), (~labels).sum()
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    _, starts, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mean_ranks = starts + (counts + 1) / 2.0
    ranks[order] = np.repeat(mean_ranks, counts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


METRICS: dict[str, Metric] = {
    "AUC": lambda s, sm, lg: auc(s, needs_large(sm, lg)),
    "APGR": apgr,
    "CPT(50%)": lambda s, sm, lg: cpt(s, sm, lg, 0.5),
    "CPT(80%)": lambda s, sm, lg: cpt(s, sm, lg, 0.8),
}


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point value with its 95% confidence interval and the sample size behind it: the one
    interval type (classifier metrics here, the simulator's tuning and A/B reports above).
    A NaN bound is undefined (too few samples for it)."""

    value: float
    low: float
    high: float
    n: int = 0

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def bootstrap(
    metric: Metric,
    scores: np.ndarray,
    small: np.ndarray,
    large: np.ndarray,
    rounds: int = 1000,
    seed: int = 0,
) -> Estimate:
    """Point value and percentile 95% interval over `rounds` resamples of the prompts."""
    rng = np.random.default_rng(seed)
    n = len(scores)
    values = []
    for _ in range(rounds):
        idx = rng.integers(0, n, n)
        values.append(metric(scores[idx], small[idx], large[idx]))
    low, high = np.nanpercentile(values, [2.5, 97.5])
    return Estimate(metric(scores, small, large), float(low), float(high), n)


def report(
    scores: np.ndarray,
    small: np.ndarray,
    large: np.ndarray,
    rounds: int = 1000,
    seed: int = 0,
) -> dict[str, dict[str, Estimate]]:
    """{"router": {metric: Estimate}, "random": {...}} on the same prompts and resamples.

    The random router draws fresh uniform scores, so its intervals show the spread of chance.
    """
    random_scores = np.random.default_rng(seed + 1).random(len(scores))
    out: dict[str, dict[str, Estimate]] = {"router": {}, "random": {}}
    for name, metric in METRICS.items():
        out["router"][name] = bootstrap(metric, scores, small, large, rounds, seed)
        out["random"][name] = bootstrap(metric, random_scores, small, large, rounds, seed)
    return out


def paired_bootstrap(
    metric: Metric,
    base: np.ndarray,
    other: np.ndarray,
    small: np.ndarray,
    large: np.ndarray,
    rounds: int = 1000,
    seed: int = 0,
) -> Estimate:
    """metric(other) - metric(base) on the same prompts, with a paired percentile 95% interval:
    each resample draws the prompts once and scores both routers on them, so the interval is of
    the difference itself (much narrower than two separate intervals when the scores agree)."""
    base, other = np.asarray(base, np.float64), np.asarray(other, np.float64)
    small, large = np.asarray(small, np.float64), np.asarray(large, np.float64)
    rng = np.random.default_rng(seed)
    n = len(base)
    values = []
    for _ in range(rounds):
        idx = rng.integers(0, n, n)
        s, g = small[idx], large[idx]
        values.append(metric(other[idx], s, g) - metric(base[idx], s, g))
    point = metric(other, small, large) - metric(base, small, large)
    if not rounds or np.isnan(values).all():
        return Estimate(point, float("nan"), float("nan"), n)
    low, high = np.nanpercentile(values, [2.5, 97.5])
    return Estimate(point, float(low), float(high), n)
