"""The promotion gate (simulations/promotion.py): it does not promote noise, it does promote a
real gain, and a policy's threshold follows its target to the new model.

Requests have features `x` and outcomes on the small and the large tier that depend on a hidden
difficulty (a linear function of `x`); a model is a ridge fit of "needs the large tier" on `x`,
scored out of fold (5 folds) as `classifier train` scores its new model. 40 seeds x 300
requests x 200 bootstrap resamples, numpy only.
"""

from __future__ import annotations

import numpy as np
import pytest

from classifiers.labels import needs_large
from simulations.promotion import Verdict, gate, recorded_verdict, retune
from simulations.sweep import SweepInputs
from simulations.tune import Target

SEEDS = 40
ROWS = 300
ROUNDS = 200


def _requests(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, 8))
    w = np.linspace(1.0, 0.2, 8)
    z = x @ w / np.linalg.norm(w)  # difficulty: the small tier fails more as it grows
    small = (rng.random(n) < 1 / (1 + np.exp(-(0.8 - 1.5 * z)))).astype(float)
    large = (rng.random(n) < 1 / (1 + np.exp(-(1.8 - 0.3 * z)))).astype(float)
    return x, small, large


def _design(x: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(x)), x])


def _ridge(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    d = _design(x)
    return np.linalg.solve(d.T @ d + np.eye(d.shape[1]), d.T @ y)


def _out_of_fold(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    fold = rng.permutation(len(y)) % 5
    scores = np.empty(len(y))
    for f in range(5):
        held = fold == f
        scores[held] = _design(x[held]) @ _ridge(x[~held], y[~held])
    return scores


def _current_model(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """The current model: fit on other traffic (2,000 requests of the same kind)."""
    xs, small, large = _requests(rng, 2000)
    return _design(x) @ _ridge(xs, needs_large(small, large).astype(float))


def test_the_gate_refuses_a_model_trained_on_shuffled_labels() -> None:
    refused = []
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        x, small, large = _requests(rng, ROWS)
        current = _current_model(rng, x)
        shuffled = rng.permutation(needs_large(small, large).astype(float))
        new = _out_of_fold(x, shuffled, rng)
        verdict = gate(current, new, small, large, ROUNDS, seed)
        refused.append(not verdict.promote)
        if verdict.promote:
            continue
        assert "not shown better" in verdict.reason() and "[" in verdict.reason()
    assert sum(refused) >= 0.95 * SEEDS, f"promoted noise in {SEEDS - sum(refused)} of {SEEDS}"


def test_the_gate_promotes_a_real_gain() -> None:
    # Without this the test above would pass for a gate that refuses everything.
    promoted = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(1000 + seed)
        x, small, large = _requests(rng, ROWS)
        uninformed = rng.random(ROWS)  # the current model knows nothing of this traffic
        new = _out_of_fold(x, needs_large(small, large).astype(float), rng)
        verdict = gate(uninformed, new, small, large, ROUNDS, seed)
        promoted += verdict.promote
        if verdict.promote:
            assert verdict.delta.low > 0 and "better" in verdict.reason()
    assert promoted >= 0.9 * SEEDS, f"promoted a real gain in only {promoted} of {SEEDS}"


def test_the_gate_checks_its_input() -> None:
    with pytest.raises(ValueError, match="equal, non-empty"):
        gate(np.zeros(3), np.zeros(2), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="equal, non-empty"):
        gate(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0))


def test_a_verdict_without_an_interval_never_promotes() -> None:
    # One request: no bootstrap spread (NaN or a point), never "above 0" by accident.
    verdict = gate(np.array([0.1]), np.array([0.9]), np.array([0.0]), np.array([1.0]), 50)
    assert not verdict.promote


def test_recorded_comparison_from_the_card() -> None:
    card = {"comparison": {"n": 500, "delta": {"APGR": {"value": 0.04, "low": 0.01, "high": 0.07}}}}
    verdict = recorded_verdict(card, "new.json")
    assert isinstance(verdict, Verdict) and verdict.promote and verdict.n == 500
    card["comparison"]["delta"]["APGR"]["low"] = -0.01  # type: ignore[index]
    assert not recorded_verdict(card, "new.json").promote
    with pytest.raises(ValueError, match="no comparison"):
        recorded_verdict({}, "new.json")


def test_retune_keeps_the_large_share_when_no_target_is_recorded() -> None:
    rng = np.random.default_rng(7)
    current = rng.random(1000)
    new = current**3  # the new model scores everything lower: the same threshold sends less large
    result = retune("main", 0.7, current, new)
    assert not result.recorded and result.share_before == pytest.approx(0.3, abs=0.03)
    assert result.share_after == pytest.approx(result.share_before, abs=0.002)
    assert result.after == pytest.approx(0.7**3, abs=0.01)
    assert "no target recorded" in result.line() and "kept its large share" in result.line()


def test_retune_meets_a_recorded_quality_target_with_the_new_model() -> None:
    rng = np.random.default_rng(3)
    x, small, large = _requests(rng, 2000)
    new = _out_of_fold(x, needs_large(small, large).astype(float), rng)
    inputs = SweepInputs(new, small, large, np.full(2000, 1e-4), np.full(2000, 1e-2))
    result = retune("main", 0.5, rng.random(2000), new, Target("quality", 0.95), inputs)
    assert result.recorded and result.quality_ratio is not None
    assert result.quality_ratio >= 0.95
    assert "recorded target (quality >= 95.0% of all-large)" in result.line()
    with pytest.raises(ValueError, match="--traces"):
        retune("main", 0.5, new, new, Target("quality", 0.95))
