"""Pick the threshold that meets a target, with Poisson-bootstrap 95% intervals on the choice.

Targets: quality >= X of all-large quality (the cheapest such threshold), cost <= $Y per 1,000
requests, or large share <= Z (the best-quality such threshold). The interval resamples requests
(each weighted by a Poisson(1) count, the large-sample form of the bootstrap that vectorises), and
reports both the spread of the metrics at the chosen threshold and the spread of the threshold
the same rule would choose on each resample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from classifiers.evaluate import Estimate
from simulations.sweep import SortedInputs, SweepInputs, SweepResult, sweep

TargetKind = Literal["quality", "cost", "large_share"]


class TuneError(ValueError):
    """No threshold meets the target (the message gives the best reachable value)."""


@dataclass(frozen=True, slots=True)
class Target:
    kind: TargetKind
    value: float

    def describe(self) -> str:
        if self.kind == "quality":
            return f"quality >= {self.value:.1%} of all-large"
        if self.kind == "cost":
            return f"cost <= ${self.value:g} per 1k requests"
        return f"large share <= {self.value:.1%}"


def _choose_rows(
    ratio: np.ndarray, cost: np.ndarray, share: np.ndarray, quality: np.ndarray, target: Target
) -> np.ndarray:
    """Chosen column per row of (rows, thresholds) metric matrices; -1 where none qualifies.

    Thresholds are ascending, so on ties argmin/argmax pick the lowest threshold; we then break
    ties towards cost (quality target) or quality (cost/share targets) explicitly.
    """
    if target.kind == "quality":
        ok = ratio >= target.value - 1e-12
        key = np.where(ok, cost, np.inf)
        # Cheapest; among equal cost the highest threshold (fewest large calls).
        pick = key.shape[1] - 1 - np.argmin(key[:, ::-1], axis=1)
    else:
        ok = (
            cost <= target.value + 1e-12 if target.kind == "cost" else share <= target.value + 1e-12
        )
        key = np.where(ok, quality - 1e-12 * cost, -np.inf)
        pick = np.argmax(key, axis=1)
    return np.where(ok.any(axis=1), pick, -1)


def choose(result: SweepResult, target: Target) -> int:
    pick = _choose_rows(
        result.quality_ratio[None],
        result.cost_per_1k[None],
        result.large_share[None],
        result.quality[None],
        target,
    )[0]
    if pick < 0:
        raise TuneError(
            f"no threshold meets {target.describe()}: {_best_reachable(result, target)}"
        )
    return int(pick)


def indistinct_labels(inputs: SweepInputs) -> str | None:
    """Why the labels cannot tell the tiers apart, or None when they can: on every labelled
    request the small and the large tier have the same outcome, so no threshold changes
    quality (an echo upstream judged by the reference judge scores both tiers 0)."""
    small, large = inputs.quality_small, inputs.quality_large
    if small.shape[0] == 0 or not bool(np.array_equal(small, large)):
        return None
    values = np.unique(small)
    same = f"all {values[0]:g}" if values.shape[0] == 1 else f"{values.shape[0]} distinct values"
    return (
        f"the labels cannot tell the tiers apart: on all {small.shape[0]} labelled requests the "
        f"small and the large tier have the same outcome ({same}), so every threshold has the "
        "same quality; grade both tiers' answers where they differ (`cost-router grades import`, "
        "docs/simulator.md)"
    )


def _best_reachable(result: SweepResult, target: Target) -> str:
    if target.kind == "quality":
        return f"the best is {result.quality_ratio.max():.1%} of all-large"
    if target.kind == "cost":
        return f"the cheapest is ${result.cost_per_1k.min():.4g} per 1k"
    return f"the smallest large share is {result.large_share.min():.1%}"


@dataclass(frozen=True)
class TuneResult:
    target: Target
    threshold: float
    large_share: float
    quality: float
    quality_ratio: float
    cost_per_1k: float
    sweep: SweepResult
    intervals: dict[str, Estimate] = field(default_factory=dict)
    resamples: int = 0
    unmet_resamples: int = 0  # resamples on which no threshold met the target
    bootstrap_method: str = "exact"  # or "moment-matched" (large traces, see bootstrap())
    labels_note: str | None = None  # indistinct_labels: the quality column says nothing

    def as_dict(self) -> dict[str, object]:
        return {
            "target": {"kind": self.target.kind, "value": self.target.value},
            "threshold": self.threshold,
            "large_share": self.large_share,
            "quality": self.quality,
            "quality_ratio": self.quality_ratio,
            "cost_per_1k": self.cost_per_1k,
            "all_large": {
                "quality": self.sweep.quality_large,
                "cost_per_1k": self.sweep.cost_large_per_1k,
            },
            "all_small": {
                "quality": self.sweep.quality_small,
                "cost_per_1k": self.sweep.cost_small_per_1k,
            },
            "ci95": {k: {"low": v.low, "high": v.high} for k, v in self.intervals.items()},
            "bootstrap_resamples": self.resamples,
            "bootstrap_unmet": self.unmet_resamples,
            "bootstrap_method": self.bootstrap_method,
            "labels_note": self.labels_note,
        }


def _metrics(cum: np.ndarray, split: np.ndarray) -> tuple[np.ndarray, ...]:
    """Metrics per resample and threshold from weighted cumulative sums.

    cum: (rows, K + 1, 5) running sums over score-sorted units (requests or segments) of
    weight x (1, q_small, q_large, c_small, c_large); split: index into K + 1 per threshold (units
    below it go small). Returns (rows, T) quality, quality ratio, cost per 1k, large share.
    """
    below = cum[:, split, :]
    total = cum[:, -1:, :]
    w = total[..., 0]
    q = (below[..., 1] + total[..., 2] - below[..., 2]) / w
    c = (below[..., 3] + total[..., 4] - below[..., 4]) / w
    all_large_q = total[..., 2] / w
    ratio = np.divide(q, all_large_q, out=np.zeros_like(q), where=all_large_q > 0)
    return q, ratio, c * 1000.0, (w - below[..., 0]) / w


def _unit_values(s: SortedInputs) -> np.ndarray:
    """(n, 5) per request in score order: 1, q_small, q_large, c_small, c_large."""
    cols = [
        np.diff(getattr(s, k)) for k in ("cum_q_small", "cum_q_large", "cum_c_small", "cum_c_large")
    ]
    return np.column_stack([np.ones(s.sorted_scores.shape[0]), *cols])


def _exact_draws(v: np.ndarray, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson(1) weight per request: weighted running sums, (rows, n + 1, 5)."""
    w = rng.poisson(1.0, size=(rows, v.shape[0])).astype(np.float64)
    w[w.sum(axis=1) == 0, 0] = 1.0  # an all-zero resample has no mean; vanishing odds
    cum = np.zeros((rows, v.shape[0] + 1, v.shape[1]))
    np.cumsum(w[:, :, None] * v[None], axis=1, out=cum[:, 1:])
    return cum


def _moment_draws(
    v: np.ndarray, split: np.ndarray, rows: int, rng: np.random.Generator
) -> np.ndarray:
    """Large traces: per segment between adjacent thresholds, the Poisson bootstrap's weighted sum
    has mean sum(v) and covariance sum(v v^T) exactly; draw it from the normal with those moments
    (segments hold thousands of requests, where the CLT makes this indistinguishable).
    Returns running sums over segments, (rows, T + 2, 5)."""
    bounds = np.concatenate([[0], split, [v.shape[0]]])
    c1 = np.concatenate([np.zeros((1, 5)), np.cumsum(v, axis=0)])
    c2 = np.concatenate([np.zeros((1, 5, 5)), np.cumsum(v[:, :, None] * v[:, None, :], axis=0)])
    mu = c1[bounds[1:]] - c1[bounds[:-1]]
    cov = c2[bounds[1:]] - c2[bounds[:-1]]
    lam, vec = np.linalg.eigh(cov)
    root = vec * np.sqrt(np.clip(lam, 0, None))[:, None, :]  # cov = root @ root.T
    z = rng.standard_normal((rows, mu.shape[0], 5))
    seg = mu[None] + np.einsum("skj,rsj->rsk", root, z)
    cum = np.zeros((rows, mu.shape[0] + 1, 5))
    np.cumsum(seg, axis=1, out=cum[:, 1:])
    return cum


EXACT_LIMIT = 20_000_000  # requests x resamples up to which weights are drawn per request


def exact_bootstrap(n: int, resamples: int, limit: int | None = None) -> bool:
    return n * resamples <= (EXACT_LIMIT if limit is None else limit)


def bootstrap(
    inputs: SweepInputs,
    thresholds: np.ndarray,
    target: Target,
    chosen: int,
    resamples: int = 1000,
    seed: int = 0,
    max_cells: int = 2_000_000,
    exact_limit: int | None = None,
) -> tuple[dict[str, Estimate], int]:
    """95% percentile intervals of the chosen point's metrics and of the re-chosen threshold
    (each Estimate's value is the point on the whole trace: the metric, or the chosen threshold).

    Exact Poisson weights per request while n x resamples <= exact_limit; beyond that, the
    moment-matched draw per threshold segment (same mean and covariance, O(thresholds) per draw).
    """
    s = SortedInputs.build(inputs)
    n = s.sorted_scores.shape[0]
    split = s.split_points(thresholds)
    v = _unit_values(s)
    rng = np.random.default_rng(seed)
    exact = exact_bootstrap(n, resamples, exact_limit)
    rows = max(1, max_cells // n) if exact else resamples
    seg_split = np.arange(1, split.shape[0] + 1)
    collected: dict[str, list[np.ndarray]] = {
        k: [] for k in ("threshold", "quality", "quality_ratio", "cost_per_1k", "large_share")
    }
    unmet = 0
    whole = np.zeros((1, n + 1, v.shape[1]))  # every request once: the point values
    np.cumsum(v, axis=0, out=whole[0, 1:])
    point = dict(
        zip(
            ("quality", "quality_ratio", "cost_per_1k", "large_share"),
            _metrics(whole, split),
            strict=True,
        )
    )
    for start in range(0, resamples, rows):
        k = min(rows, resamples - start)
        if exact:
            q, ratio, cost, share = _metrics(_exact_draws(v, k, rng), split)
        else:
            q, ratio, cost, share = _metrics(_moment_draws(v, split, k, rng), seg_split)
        pick = _choose_rows(ratio, cost, share, q, target)
        unmet += int((pick < 0).sum())
        collected["threshold"].append(thresholds[pick[pick >= 0]])
        for name, m in (
            ("quality", q),
            ("quality_ratio", ratio),
            ("cost_per_1k", cost),
            ("large_share", share),
        ):
            collected[name].append(m[:, chosen])
    intervals = {}
    for name, parts in collected.items():
        vals = np.concatenate(parts)
        if vals.size:
            lo, hi = np.percentile(vals, [2.5, 97.5])
            value = thresholds[chosen] if name == "threshold" else point[name][0, chosen]
            intervals[name] = Estimate(float(value), float(lo), float(hi), n)
    return intervals, unmet


def tune(
    inputs: SweepInputs,
    target: Target,
    thresholds: np.ndarray,
    resamples: int = 1000,
    seed: int = 0,
) -> TuneResult:
    note = indistinct_labels(inputs)
    if note is not None and target.kind == "quality":
        raise TuneError(f"cannot tune for {target.describe()}: {note}")
    result = sweep(inputs, thresholds)
    i = choose(result, target)
    intervals, unmet = (
        bootstrap(inputs, result.thresholds, target, i, resamples, seed) if resamples else ({}, 0)
    )
    return TuneResult(
        target=target,
        threshold=float(result.thresholds[i]),
        large_share=float(result.large_share[i]),
        quality=float(result.quality[i]),
        quality_ratio=float(result.quality_ratio[i]),
        cost_per_1k=float(result.cost_per_1k[i]),
        sweep=result,
        intervals=intervals,
        resamples=resamples,
        unmet_resamples=unmet,
        bootstrap_method=(
            "exact" if exact_bootstrap(len(inputs.scores), resamples) else "moment-matched"
        ),
        labels_note=note,
    )
