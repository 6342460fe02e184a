"""The paired comparison behind `classifier train`'s report and the promotion gate, on real
GSM8K outcomes."""

from __future__ import annotations

import numpy as np
import pytest

from classifiers.compare import compare_models
from classifiers.dataset import load_dataset, routellm_data_dir
from classifiers.evaluate import apgr, paired_bootstrap


@pytest.fixture(scope="module")
def outcomes() -> tuple[np.ndarray, np.ndarray]:
    ds = load_dataset(routellm_data_dir() / "gsm8k")
    return ds.small, ds.large


def test_same_scores_differ_by_exactly_zero(outcomes: tuple[np.ndarray, np.ndarray]) -> None:
    small, large = outcomes
    scores = np.random.default_rng(0).random(len(small))
    result = compare_models(scores, scores, small, large, rounds=100)
    assert (result.delta.value, result.delta.low, result.delta.high) == (0.0, 0.0, 0.0)
    assert not result.better and result.n == len(small)


def test_a_real_gain_is_shown_and_noise_is_not(outcomes: tuple[np.ndarray, np.ndarray]) -> None:
    small, large = outcomes
    rng = np.random.default_rng(1)
    random_scores = rng.random(len(small))
    # Knows which prompts the large model helps, blurred: a real but imperfect router.
    informed = (large - small) + rng.normal(0, 1.0, len(small))
    result = compare_models(random_scores, informed, small, large, rounds=300)
    assert result.better and result.delta.low > 0
    assert result.new_apgr.value > result.current_apgr.value
    assert result.cpt50_delta.value < 0  # fewer large calls for half the gap
    assert result.as_dict()["better"] is True and "APGR gain (paired)" in result.lines()[3]
    # Two routers that know nothing: the paired interval excludes 0 about 5% of the time.
    shown = sum(
        paired_bootstrap(
            apgr,
            np.random.default_rng(s).random(len(small)),
            np.random.default_rng(100 + s).random(len(small)),
            small,
            large,
            rounds=200,
            seed=s,
        ).low
        > 0
        for s in range(12)
    )
    assert shown <= 2


def test_mismatched_arrays_are_refused(outcomes: tuple[np.ndarray, np.ndarray]) -> None:
    small, large = outcomes
    with pytest.raises(ValueError, match="equal, non-empty"):
        compare_models(np.zeros(3), np.zeros(4), small[:3], large[:3])
