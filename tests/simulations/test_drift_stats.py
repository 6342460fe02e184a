"""The drift statistics (simulations/drift_stats.py) and the reference distribution's file
(classifiers/score_reference.py): against scipy, brute force and their documented guarantees."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from classifiers.model_files import ModelFiles
from classifiers.score_reference import (
    ScoreReference,
    ScoreReferenceError,
    bin_counts,
    quantile_from_counts,
    rebin,
)
from policies.target_share import threshold_for_share
from simulations.drift_stats import (
    BernoulliCusum,
    GaussianCusum,
    RetainedAccumulator,
    cusum_limit,
    ks_binned,
    psi,
    window_alpha,
    windows_limit,
)


def test_reference_round_trips_and_names_bad_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ref = ScoreReference.from_scores(rng.beta(2, 5, 5000), source="t", model="m.onnx")
    path = ref.save(tmp_path / "m.scores.json")
    back = ScoreReference.load(path)
    assert back.n == 5000 and back.bins == 1000 and back.source == "t"
    assert np.array_equal(back.counts, ref.counts)
    assert ModelFiles(tmp_path / "new.onnx").scores == tmp_path / "new.scores.json"
    bad = tmp_path / "bad.scores.json"
    for text, needle in [
        ("[1]", "JSON object"),
        ('{"schema_version": 9}', "schema_version"),
        ('{"schema_version": 1, "counts": [0, 0]}', "no scores"),
        ('{"schema_version": 1, "counts": [1, -1]}', "counts"),
        ("{", "not JSON"),
    ]:
        bad.write_text(text)
        with pytest.raises(ScoreReferenceError, match=needle) as err:
            ScoreReference.load(bad)
        assert str(bad) in str(err.value)
    with pytest.raises(ScoreReferenceError, match="cannot read"):
        ScoreReference.load(tmp_path / "absent.json")


def test_bins_clip_and_quantile_matches_threshold_for_share() -> None:
    counts = bin_counts(np.array([-0.1, 0.0, 0.5, 1.0, 1.2]), 10)
    assert counts[0] == 2 and counts[5] == 1 and counts[9] == 2
    assert rebin(np.arange(1000), 20).shape == (20,)
    scores = np.random.default_rng(1).beta(2, 3, 20_000)
    for share in (0.1, 0.3, 0.5):
        exact = threshold_for_share(scores, share)
        assert abs(quantile_from_counts(bin_counts(scores), share) - exact) < 2e-3


def test_psi_zero_for_same_and_finite_with_empty_bins() -> None:
    a = np.array([10, 20, 30, 40])
    assert psi(a, a * 3) == pytest.approx(0.0)
    shifted = psi(a, np.array([40, 30, 20, 10]))
    assert shifted > 0.2
    assert np.isfinite(psi(np.array([10, 0, 10, 0]), np.array([0, 10, 0, 10])))
    assert np.isnan(psi(a, np.zeros(4)))


def test_ks_binned_equals_scipy_on_bin_centres() -> None:
    rng = np.random.default_rng(2)
    ref, cur = bin_counts(rng.beta(2, 5, 4000)), bin_counts(rng.beta(2.3, 5, 3000))
    centres = (np.arange(1000) + 0.5) / 1000
    expected = stats.ks_2samp(np.repeat(centres, ref), np.repeat(centres, cur), method="asymp")
    got = ks_binned(ref, cur)
    assert got.statistic == pytest.approx(expected.statistic)
    assert got.pvalue == pytest.approx(expected.pvalue, rel=1e-6)


def test_alpha_spending_and_cusum_limit() -> None:
    # One false alarm per 30 days over hourly windows and two tests: 1 / 1440 per test.
    assert window_alpha(3600, 1.0, 2) == pytest.approx(1 / 1440)
    assert window_alpha(86_400, 1.0, 1) == pytest.approx(1 / 30)
    assert cusum_limit(1.0, 1000) == pytest.approx(np.log(2 * 720_000))
    with pytest.raises(ValueError):
        window_alpha(0, 1.0)


def naive_cusum(events: np.ndarray, p0: float, delta: float, h: float) -> list[int]:
    up, down = p0 + delta, p0 - delta
    inc = [
        (np.log(up / p0), np.log((1 - up) / (1 - p0))),
        (np.log(down / p0), np.log((1 - down) / (1 - p0))),
    ]
    s, alarms = [0.0, 0.0], []
    for i, e in enumerate(events):
        for side in (0, 1):
            s[side] = max(0.0, s[side] + inc[side][0 if e else 1])
        if max(s) >= h:
            alarms.append(i)
            s = [0.0, 0.0]
    return alarms


def test_cusum_vectorised_equals_the_recursion_across_batches() -> None:
    rng = np.random.default_rng(3)
    events = rng.random(6000) < np.where(np.arange(6000) < 3000, 0.3, 0.42)
    expected = naive_cusum(events, 0.3, 0.05, 6.0)
    cusum = BernoulliCusum(0.3, 0.05, 6.0)
    got: list[int] = []
    for chunk in np.array_split(events, 7):
        got += cusum.update(chunk)
    assert got == expected and got


def test_cusum_false_alarm_rate_and_delay() -> None:
    h = cusum_limit(1.0, 1000)
    rng = np.random.default_rng(4)
    # Stationary: 100,000 requests at the target share; ARL0 >= e^h = 1.44M per side.
    stationary = BernoulliCusum(0.3, 0.05, h)
    assert stationary.update(rng.random(100_000) < 0.3) == []
    # A 10-point shift is found within a few hundred requests.
    shifted = BernoulliCusum(0.3, 0.05, h)
    alarms = shifted.update(rng.random(5000) < 0.4)
    assert alarms and alarms[0] < 1500


def test_quality_retained_interval_covers_and_test_rejects() -> None:
    rng = np.random.default_rng(5)
    large = (rng.random(4000) < 0.8).astype(float)
    routed = np.where(rng.random(4000) < 0.7, (rng.random(4000) < 0.6).astype(float), large)
    acc = RetainedAccumulator()
    for part in np.array_split(np.arange(4000), 3):
        acc.add(routed[part], large[part])
    est = acc.estimate()
    assert est is not None and est.n == 4000
    assert est.value == pytest.approx(routed.mean() / large.mean())
    # Bootstrap agrees with the delta-method width.
    boots = [
        (routed[i].mean() / large[i].mean())
        for i in (rng.integers(0, 4000, 4000) for _ in range(400))
    ]
    assert est.high - est.low == pytest.approx(2 * 1.96 * np.std(boots), rel=0.2)


def test_quality_cusum_adds_evidence_across_windows() -> None:
    h = windows_limit(1 / 3, 3600)  # a third of one false alarm per 30 days, hourly
    assert h == pytest.approx(np.log(720 * 3))
    rng = np.random.default_rng(6)
    # In control (true value above the limit): 10 years of hourly windows, no alarm.
    quiet = GaussianCusum(0.93, 0.88, h)
    assert not any(quiet.update(0.97 + rng.normal(0, 0.03), 0.03) for _ in range(87_600))
    # A drop to 0.87 with se 0.03: no single window is conclusive, a few together are.
    drop = GaussianCusum(0.93, 0.88, h)
    fired = [drop.update(0.87 + rng.normal(0, 0.03), 0.03) for _ in range(40)]
    assert any(fired) and fired.index(True) >= 1
