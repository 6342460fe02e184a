"""Threshold sweep, Pareto frontier and tuning against brute force through the real policy."""

from __future__ import annotations

import numpy as np
import pytest

from policies.threshold import ThresholdPolicy
from simulations.sweep import SweepInputs, default_thresholds, pareto_front, sweep
from simulations.tune import Target, TuneError, bootstrap, choose, tune


def _inputs(n: int = 3000, seed: int = 0) -> SweepInputs:
    rng = np.random.default_rng(seed)
    # Scores on a 0.005 grid so many land exactly on thresholds (the >= edge matters).
    scores = np.round(rng.random(n) * 200) / 200
    q_small = (rng.random(n) < 0.6 - 0.3 * scores).astype(float)
    q_large = (rng.random(n) < 0.85).astype(float)
    tokens = rng.integers(10, 500, n)
    return SweepInputs(scores, q_small, q_large, tokens * 0.6e-6, tokens * 30e-6)


def test_sweep_equals_policy_replay_at_every_threshold() -> None:
    inp = _inputs()
    res = sweep(inp, default_thresholds(201))
    for k, t in enumerate(res.thresholds):
        large = ThresholdPolicy("p", "small", "large", float(t)).decide_batch(inp.scores) == 1
        q = np.where(large, inp.quality_large, inp.quality_small).mean()
        c = np.where(large, inp.cost_large, inp.cost_small).mean() * 1000
        assert res.large_share[k] == pytest.approx(large.mean(), abs=1e-12)
        assert res.quality[k] == pytest.approx(q, abs=1e-12)
        assert res.cost_per_1k[k] == pytest.approx(c, rel=1e-9)
    assert res.large_share[0] == 1.0  # t = 0: everything large
    assert res.quality_large == pytest.approx(inp.quality_large.mean())


def test_pareto_front_is_undominated_and_complete() -> None:
    rng = np.random.default_rng(3)
    cost, quality = rng.random(300), rng.random(300)
    front = set(pareto_front(cost, quality).tolist())
    for i in range(300):
        dominated = np.any(
            (cost <= cost[i])
            & (quality >= quality[i])
            & ((cost < cost[i]) | (quality > quality[i]))
        )
        assert (i in front) == (not dominated)


def test_choose_cheapest_meeting_quality_target() -> None:
    res = sweep(_inputs(), default_thresholds(201))
    i = choose(res, Target("quality", 0.95))
    assert res.quality_ratio[i] >= 0.95
    ok = res.quality_ratio >= 0.95
    assert res.cost_per_1k[i] == res.cost_per_1k[ok].min()
    j = choose(res, Target("cost", 10.0))
    assert res.cost_per_1k[j] <= 10.0
    assert res.quality[j] == res.quality[res.cost_per_1k <= 10.0].max()
    k = choose(res, Target("large_share", 0.25))
    assert res.large_share[k] <= 0.25
    with pytest.raises(TuneError, match="best is"):
        choose(res, Target("quality", 1.5))


def test_bootstrap_interval_brackets_the_point_and_shrinks_with_n() -> None:
    small, big = _inputs(500, 1), _inputs(20_000, 1)
    widths = []
    for inp in (small, big):
        r = tune(inp, Target("quality", 0.95), default_thresholds(201), resamples=300, seed=0)
        ci = r.intervals["quality_ratio"]
        assert ci.low <= r.quality_ratio <= ci.high
        assert r.intervals["threshold"].low <= r.threshold <= r.intervals["threshold"].high
        widths.append(ci.high - ci.low)
    assert widths[1] < widths[0] / 3  # ~ 1/sqrt(40) of the width


def test_bootstrap_metrics_match_a_plain_resample() -> None:
    # With resamples=1 and a fixed seed, the vectorised path equals recomputing on the weights.
    inp = _inputs(400, 5)
    th = default_thresholds(51)
    res = sweep(inp, th)
    i = choose(res, Target("quality", 0.9))
    intervals, _ = bootstrap(inp, th, Target("quality", 0.9), i, resamples=1, seed=11)
    w = np.random.default_rng(11).poisson(1.0, size=(1, 400)).astype(float)[0]
    large = inp.scores >= th[i]
    q = np.where(large, inp.quality_large, inp.quality_small)
    assert intervals["quality"].low == pytest.approx((w * q).sum() / w.sum())


def test_moment_matched_bootstrap_agrees_with_exact_on_large_n() -> None:
    inp = _inputs(40_000, 9)
    th = default_thresholds(101)
    target = Target("quality", 0.95)
    i = choose(sweep(inp, th), target)
    exact, _ = bootstrap(inp, th, target, i, resamples=400, seed=1)
    approx, _ = bootstrap(inp, th, target, i, resamples=400, seed=2, exact_limit=0)
    for name in ("quality", "cost_per_1k", "large_share"):
        e, a = exact[name], approx[name]
        width = e.high - e.low
        assert abs(a.low - e.low) < 0.25 * width and abs(a.high - e.high) < 0.25 * width, name
