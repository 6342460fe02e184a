"""Each policy's decisions. decide_batch agreeing with decide for every registered type, tiers
and tunable thresholds are in test_policy_conformance.py; here what is particular to one type."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import BatchContext, BudgetView, RoutingContext
from policies.budget_pacing import BudgetPacingPolicy
from policies.fixed import FixedPolicy
from policies.random_split import RandomPolicy
from policies.threshold import ThresholdPolicy
from policies.tiers import TiersPolicy

SCORES = st.lists(st.floats(min_value=0, max_value=1, allow_nan=False), min_size=1, max_size=50)


def test_threshold_boundary_goes_large() -> None:
    p = ThresholdPolicy("t", "small", "large", 0.4)
    assert p.tiers() == ["small", "large"]
    assert p.decide(RoutingContext(score=0.4)).tier == "large"
    assert p.decide(RoutingContext(score=0.3999)).tier == "small"
    d = p.decide(RoutingContext(score=0.9))
    assert (d.tier, d.policy) == ("large", "t")


def test_threshold_batch_agrees_on_float32_input() -> None:
    p = ThresholdPolicy("t", "s", "l", 0.3)
    scores = np.random.default_rng(1).random(5000).astype(np.float32)
    single = [p.decide(RoutingContext(score=float(s))).tier == "l" for s in scores]
    assert p.decide_batch(scores).astype(bool).tolist() == single


def test_tiers_bands() -> None:
    p = TiersPolicy("n", ["a", "b", "c"], [0.3, 0.7])
    got = [p.decide(RoutingContext(score=s)).tier for s in (0.0, 0.29, 0.3, 0.69, 0.7, 1.0)]
    assert got == ["a", "a", "b", "b", "c", "c"]


@settings(max_examples=60, deadline=None)
@given(SCORES, st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=4))
def test_tiers_batch_agrees(scores: list[float], thresholds: list[float]) -> None:
    thresholds = sorted(thresholds)
    names = [f"t{i}" for i in range(len(thresholds) + 1)]
    p = TiersPolicy("n", names, thresholds)
    scores += thresholds  # exactly on a band edge: the band above
    singles = [names.index(p.decide(RoutingContext(score=s)).tier) for s in scores]
    assert p.decide_batch(np.asarray(scores)).tolist() == singles


def test_tiers_rejects_descending_thresholds() -> None:
    with pytest.raises(ValueError, match="ascending"):
        TiersPolicy("n", ["a", "b", "c"], [0.7, 0.3])


def test_fixed_always_one_tier() -> None:
    p = FixedPolicy("control", "large")
    assert {p.decide(RoutingContext(score=s)).tier for s in (0.0, 0.5, 1.0)} == {"large"}
    assert p.decide_batch(np.array([0.1, 0.9])).tolist() == [0, 0]


def test_random_share_and_replayable() -> None:
    p = RandomPolicy("r", "s", "l", 0.25, seed="x")
    ids = [f"req-{i}" for i in range(20000)]
    batch = p.decide_batch(np.zeros(len(ids)), BatchContext(units=ids))
    assert abs(batch.mean() - 0.25) < 0.015
    singles = [p.decide(RoutingContext(score=0.0, unit=u)).tier == "l" for u in ids[:500]]
    assert batch[:500].astype(bool).tolist() == singles
    # Same seed, same draws, in a fresh object (a restart).
    again = RandomPolicy("r", "s", "l", 0.25, seed="x").decide_batch(
        np.zeros(500), BatchContext(units=ids[:500])
    )
    assert again.tolist() == batch[:500].tolist()


def test_random_ignores_score_and_default_units_are_row_numbers() -> None:
    p = RandomPolicy("r", "s", "l", 0.5)
    rows = p.decide_batch(np.linspace(0, 1, 200))
    singles = [
        p.tiers().index(p.decide(RoutingContext(score=1.0, unit=str(i))).tier) for i in range(200)
    ]
    assert rows.tolist() == singles
    assert RandomPolicy("r", "s", "l", 0.0).decide_batch(np.ones(100)).sum() == 0
    assert RandomPolicy("r", "s", "l", 1.0).decide_batch(np.zeros(100)).sum() == 100


def _view(spent: float, elapsed: float, limit: float | None = 100.0) -> BudgetView:
    return BudgetView(limit_usd=limit, spent_usd=spent, reserved_usd=0.0, period_elapsed=elapsed)


def test_pacing_threshold_rises_smoothly_when_behind() -> None:
    p = BudgetPacingPolicy("p", "s", "l", threshold=0.4, max_threshold=1.0, slack=0.2, reserve=0)
    assert p.effective_threshold(None) == 0.4
    assert p.effective_threshold(_view(0, 0.5, limit=None)) == 0.4
    assert p.effective_threshold(_view(40, 0.5)) == 0.4  # under pace
    assert p.effective_threshold(_view(50, 0.5)) == pytest.approx(0.4)  # exactly on pace
    # 60% left of budget, 50% of period left... vs 45% left: r = 0.9 (half the slack) -> midpoint
    assert p.effective_threshold(_view(55, 0.5)) == pytest.approx(0.7)
    assert p.effective_threshold(_view(60, 0.5)) == pytest.approx(1.0)  # r = 0.8: maxed
    assert p.effective_threshold(_view(100, 0.5)) == pytest.approx(1.0)
    ts = [p.effective_threshold(_view(spent, 0.5)) for spent in np.linspace(45, 65, 81)]
    assert all(b >= a for a, b in zip(ts, ts[1:], strict=False))
    assert max(np.diff(ts)) < 0.05  # no jumps


def test_pacing_total_budget_rises_only_near_exhaustion() -> None:
    p = BudgetPacingPolicy("p", "s", "l", threshold=0.4, slack=0.2, reserve=0)
    assert p.effective_threshold(_view(50, 0.0)) == 0.4
    assert p.effective_threshold(_view(90, 0.0)) == pytest.approx(0.7)
    assert p.effective_threshold(_view(100, 0.0)) == pytest.approx(1.0)


def test_pacing_with_threshold_keeps_its_settings_and_ceiling() -> None:
    p = BudgetPacingPolicy("p", "s", "l", threshold=0.4, max_threshold=0.8, slack=0.3, reserve=0.1)
    low = p.with_threshold(0.2)
    assert (low.threshold, low.max_threshold, low.slack, low.reserve) == (0.2, 0.8, 0.3, 0.1)
    # A base above the ceiling lifts the ceiling with it (max_threshold >= threshold always).
    assert p.with_threshold(0.9).max_threshold == 0.9
