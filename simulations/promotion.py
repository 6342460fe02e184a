"""The promotion gate and the threshold re-tune behind `cost-router classifier promote`.

`gate` is a pure function: the current and the new model's scores of the same labelled requests
(the new model's out of fold) and the requests' outcomes -> a Verdict. It promotes only when the
whole paired 95% bootstrap interval of the APGR gain (new - current) lies above 0
(classifiers.compare: the prompts are resampled together, so the interval is of the difference
itself). A model trained on noise does not pass it (tests/simulations/test_promotion_gate.py).

`retune` moves a policy's threshold to where the new model meets the policy's target: a recorded
target (quality, cost or large share; re-tuned with simulations.tune on the labelled requests), or,
with none recorded, the large share the policy had with the current model at its threshold on the
same requests (the new model's threshold for that share; needs no outcomes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from classifiers.compare import apgr_gain, paired_arrays
from classifiers.evaluate import Estimate
from policies.target_share import achieved_share, threshold_for_share
from simulations.sweep import SweepInputs, default_thresholds
from simulations.tune import Target, tune


@dataclass(frozen=True)
class Verdict:
    """The gate's answer: `delta` is APGR(new) - APGR(current) with its paired 95% interval."""

    delta: Estimate
    n: int  # labelled requests behind the interval
    source: str  # where the comparison comes from, for the message

    @property
    def promote(self) -> bool:
        # NaN bounds (too few requests for an interval) never pass.
        return bool(self.delta.low > 0)

    def reason(self) -> str:
        """One line: the decision with the interval it rests on."""
        where = f"on {self.n} labelled requests ({self.source})"
        if self.promote:
            return f"the new model is better: APGR gain {self.delta} {where}, interval above 0"
        return (
            f"the new model is not shown better: APGR gain {self.delta} {where}; the paired 95% "
            "interval must lie above 0"
        )


def gate(
    current: np.ndarray,
    new: np.ndarray,
    small: np.ndarray,
    large: np.ndarray,
    rounds: int = 1000,
    seed: int = 0,
    source: str = "paired bootstrap, new model out of fold",
) -> Verdict:
    """Should the new model replace the current one? Both score the same requests, whose
    outcomes on the small and the large tier are `small` and `large` (in [0, 1]). The interval
    is classifiers.compare.compare_models' APGR gain (same resamples for the same seed), computed
    alone: the gate needs nothing else. Raises ValueError for empty or unequal arrays."""
    arrays = paired_arrays("gate", current, new, small, large)
    return Verdict(apgr_gain(*arrays, rounds, seed), len(arrays[0]), source)


def recorded_verdict(out_of_fold: Mapping[str, Any], model: str) -> Verdict:
    """The verdict of the comparison `classifier train` recorded in the model's card (its JSON
    metadata's `out_of_fold.comparison`). Raises ValueError when the card has none."""
    comparison = out_of_fold.get("comparison")
    try:
        assert isinstance(comparison, Mapping)
        delta = comparison["delta"]["APGR"]
        estimate = Estimate(float(delta["value"]), float(delta["low"]), float(delta["high"]))
        n = int(comparison["n"])
    except (AssertionError, KeyError, TypeError, ValueError):
        raise ValueError(f"{model}: the card's out_of_fold has no comparison to gate on") from None
    return Verdict(estimate, n, f"recorded by classifier train in {model}")


@dataclass(frozen=True)
class Retuned:
    """A policy's threshold before and after the swap, and the target it was moved to meet."""

    policy: str
    before: float
    after: float
    target: Target
    recorded: bool  # False: no target recorded, the large share the policy had is kept
    share_before: float  # the current model's large share at `before` on the labelled requests
    share_after: float  # the new model's at `after`
    quality_ratio: float | None = None  # the new model's at `after` (None without outcomes)

    def line(self) -> str:
        how = (
            f"to its recorded target ({self.target.describe()})"
            if self.recorded
            else f"no target recorded: kept its large share {self.share_before:.1%}"
        )
        quality = (
            f", quality {self.quality_ratio:.1%} of all-large"
            if self.quality_ratio is not None and math.isfinite(self.quality_ratio)
            else ""
        )
        return (
            f"policies.{self.policy}.threshold {self.before:.6g} -> {self.after:.6g} {how} "
            f"(large share {self.share_before:.1%} -> {self.share_after:.1%}{quality})"
        )


def retune(
    policy: str,
    threshold: float,
    current: np.ndarray,
    new: np.ndarray,
    target: Target | None = None,
    inputs: SweepInputs | None = None,
    grid: int = 1001,
) -> Retuned:
    """The threshold that gives the new model (scores `new`) the policy's target on the labelled
    requests. `target` None: the large share the current model (scores `current`) has at
    `threshold`. A recorded quality or cost target needs `inputs` (the requests' outcomes and
    costs, with the new model's scores); raises ValueError without them,
    simulations.tune.TuneError when the target cannot be met."""
    current, new = np.asarray(current, np.float64), np.asarray(new, np.float64)
    share_before = achieved_share(current, threshold)
    if target is None:
        after = round(threshold_for_share(new, share_before), 6)
        ratio = None
        if inputs is not None:
            ratio = _quality_ratio(inputs, after)
        return Retuned(
            policy,
            threshold,
            after,
            Target("large_share", share_before),
            False,
            share_before,
            achieved_share(new, after),
            ratio,
        )
    if inputs is None and target.kind == "large_share":
        after = round(threshold_for_share(new, target.value), 6)
        return Retuned(
            policy, threshold, after, target, True, share_before, achieved_share(new, after)
        )
    if inputs is None:
        raise ValueError(
            f"policies.{policy}: its target ({target.describe()}) needs the requests' outcomes: "
            "pass --traces"
        )
    result = tune(inputs, target, default_thresholds(grid), resamples=0)
    after = round(result.threshold, 6)
    return Retuned(
        policy,
        threshold,
        after,
        target,
        True,
        share_before,
        achieved_share(new, after),
        result.quality_ratio,
    )


def _quality_ratio(inputs: SweepInputs, threshold: float) -> float:
    large = inputs.scores >= threshold
    quality = np.where(large, inputs.quality_large, inputs.quality_small).mean()
    all_large = inputs.quality_large.mean()
    return float(quality / all_large) if all_large > 0 else float("nan")
