"""APGR / CPT / AUC against hand-checked cases and scikit-learn's AUC."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score

from classifiers.evaluate import apgr, auc, bootstrap, cpt, pgr_curve, report


def _data(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.random(n) < 0.6).astype(float), (rng.random(n) < 0.8).astype(float)


def test_constant_score_is_the_random_router() -> None:
    small, large = _data()
    assert abs(apgr(np.zeros(len(small)), small, large) - 0.5) < 1e-12


def test_oracle_beats_random_and_curve_ends_at_one() -> None:
    small, large = _data()
    oracle = large - small
    curve = pgr_curve(oracle, small, large)
    assert curve[0] == 0.0 and abs(curve[-1] - 1.0) < 1e-12
    assert apgr(oracle, small, large) > 1.0
    assert apgr(-oracle, small, large) < 0.0
    assert cpt(oracle, small, large, 0.8) < 0.5


def test_cpt_hand_example() -> None:
    # Two prompts gain from large, two don't: PGR reaches 50% after the first prompt.
    small = np.array([0.0, 0.0, 1.0, 1.0])
    large = np.array([1.0, 1.0, 1.0, 1.0])
    scores = np.array([0.9, 0.8, 0.2, 0.1])
    assert cpt(scores, small, large, 0.5) == 0.25
    assert cpt(scores, small, large, 0.8) == 0.5


def test_auc_matches_sklearn_with_ties() -> None:
    rng = np.random.default_rng(1)
    labels = rng.random(300) < 0.3
    scores = np.round(rng.random(300) + labels * 0.3, 1)
    assert abs(auc(scores, labels) - roc_auc_score(labels, scores)) < 1e-12


def test_bootstrap_interval_contains_value() -> None:
    small, large = _data()
    scores = (large - small) + np.random.default_rng(2).normal(0, 1, len(small))
    est = bootstrap(apgr, scores, small, large, rounds=200)
    assert est.low <= est.value <= est.high
    out = report(scores, small, large, rounds=100)
    assert out["router"]["APGR"].value > out["random"]["APGR"].low
