"""Is a new model better than the current one on the same labelled requests? The paired
comparison behind `classifier train`'s report and the promotion gate.

Both models score the same requests (the new one out of fold: classifiers.train.out_of_fold), and
the prompts are resampled together (classifiers.evaluate.paired_bootstrap), so the interval is of
the difference in routing quality itself. `Comparison.better` is the gate's rule: the whole 95%
interval of the APGR gain is above 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from classifiers.evaluate import Estimate, apgr, bootstrap, cpt, paired_bootstrap


def cpt50(scores: np.ndarray, small: np.ndarray, large: np.ndarray) -> float:
    return cpt(scores, small, large, 0.5)


@dataclass(frozen=True)
class Comparison:
    """Current vs new model on `n` requests. `delta` = APGR(new) - APGR(current); `cpt50_delta`
    = CPT(50%)(new) - CPT(50%)(current) (negative: the new model needs fewer large calls)."""

    current_apgr: Estimate
    new_apgr: Estimate
    delta: Estimate
    current_cpt50: Estimate
    new_cpt50: Estimate
    cpt50_delta: Estimate
    n: int

    @property
    def better(self) -> bool:
        """The promotion gate's rule: the APGR gain's 95% interval lies above 0."""
        return bool(self.delta.low > 0)

    def as_dict(self) -> dict[str, object]:
        def est(e: Estimate) -> dict[str, float]:
            return {"value": e.value, "low": e.low, "high": e.high}

        return {
            "n": self.n,
            "better": self.better,
            "current": {"APGR": est(self.current_apgr), "CPT(50%)": est(self.current_cpt50)},
            "new": {"APGR": est(self.new_apgr), "CPT(50%)": est(self.new_cpt50)},
            "delta": {"APGR": est(self.delta), "CPT(50%)": est(self.cpt50_delta)},
        }

    def lines(self) -> list[str]:
        """The comparison as the commands print it."""
        verdict = "better" if self.better else "not shown better"
        return [
            f"on {self.n} labelled requests (95% bootstrap intervals; new model out of fold):",
            f"  APGR      current {self.current_apgr}  new {self.new_apgr}",
            f"  CPT(50%)  current {self.current_cpt50}  new {self.new_cpt50}",
            f"  APGR gain (paired) {self.delta}: {verdict}",
            f"  CPT(50%) change (paired) {self.cpt50_delta}",
        ]


def compare_models(
    current_scores: np.ndarray,
    new_scores: np.ndarray,
    small: np.ndarray,
    large: np.ndarray,
    rounds: int = 1000,
    seed: int = 0,
) -> Comparison:
    """Compare two models' scores of the same requests, whose outcomes are `small` and `large`
    (both known, in [0, 1]). Raises ValueError when the arrays differ in length or are empty."""
    cur, new, sm, lg = paired_arrays("compare_models", current_scores, new_scores, small, large)
    n = len(cur)
    return Comparison(
        current_apgr=bootstrap(apgr, cur, sm, lg, rounds, seed),
        new_apgr=bootstrap(apgr, new, sm, lg, rounds, seed),
        delta=apgr_gain(cur, new, sm, lg, rounds, seed),
        current_cpt50=bootstrap(cpt50, cur, sm, lg, rounds, seed),
        new_cpt50=bootstrap(cpt50, new, sm, lg, rounds, seed),
        cpt50_delta=paired_bootstrap(cpt50, cur, new, sm, lg, rounds, seed),
        n=n,
    )


def paired_arrays(who: str, *arrays: np.ndarray) -> list[np.ndarray]:
    """The scores and outcomes of one paired comparison as float arrays; ValueError (naming
    `who`) when they are empty or differ in length."""
    out = [np.asarray(a, np.float64) for a in arrays]
    if not len(out[0]) or any(len(a) != len(out[0]) for a in out):
        sizes = [len(a) for a in out]
        raise ValueError(f"{who}: need equal, non-empty arrays, got lengths {sizes}")
    return out


def apgr_gain(
    current: np.ndarray,
    new: np.ndarray,
    small: np.ndarray,
    large: np.ndarray,
    rounds: int = 1000,
    seed: int = 0,
) -> Estimate:
    """APGR(new) - APGR(current) with its paired 95% interval: the promotion gate's figure."""
    return paired_bootstrap(apgr, current, new, small, large, rounds, seed)
