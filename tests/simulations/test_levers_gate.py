"""The lever gate never passes without evidence (issue 25, item 2): ties give an interval as
wide as their number allows, not zero-width, and a minimum of pairs that are not ties."""

from __future__ import annotations

import numpy as np
import pytest

from classifiers.evaluate import Estimate
from simulations.levers.gate import DEFAULT_MIN_INFORMATIVE_PAIRS, Tolerance, verdict
from simulations.levers.store import JudgeRow
from simulations.levers.summary import Quality, Row, quality, score_bound

GATE = Tolerance(max_quality_loss=0.02, confidence=0.95)


def _pairs(wins: int, ties: int, losses: int) -> list[JudgeRow]:
    outcomes = [(0.0, 1.0)] * wins + [(0.0, 0.0)] * ties + [(1.0, 0.0)] * losses
    return [
        JudgeRow(f"p{i}", "cand", "ref", "reference", "v1", "label", r, c)
        for i, (r, c) in enumerate(outcomes)
    ]


def _row(q: Quality) -> Row:
    nan = float("nan")
    return Row("cand", "alone", None, q.labelled, 0, *([nan] * 10), quality=q)


def _verdict(wins: int, ties: int, losses: int, tol: Tolerance = GATE) -> tuple[bool, str]:
    v = verdict(_row(quality(_pairs(wins, ties, losses), tol.confidence)), tol)
    return v.passed, "; ".join(v.reasons)


def test_eight_ties_fail_with_a_wide_interval_and_too_little_evidence() -> None:
    q = quality(_pairs(0, 8, 0), 0.95)
    assert q.delta.value == 0.0 and q.informative == 0
    assert q.delta.low < -0.3 and q.delta.high > 0.3  # a bootstrap alone gives [0, 0]
    passed, why = _verdict(0, 8, 0)
    assert not passed
    assert "lower bound -0.3" in why and "(8 judged pairs, 0 not ties)" in why
    assert f"at least {DEFAULT_MIN_INFORMATIVE_PAIRS} needed" in why
    # The interval alone fails it too.
    passed, why = _verdict(0, 8, 0, Tolerance(max_quality_loss=0.02, min_informative_pairs=0))
    assert not passed and "too little evidence" not in why


def test_many_ties_are_evidence_of_no_loss_only_in_number() -> None:
    relaxed = Tolerance(max_quality_loss=0.02, min_informative_pairs=0)
    assert _verdict(0, 500, 0, relaxed)[0]  # 500 ties: a 2-point loss is ruled out
    assert not _verdict(0, 100, 0, relaxed)[0]  # 100 are not enough for that
    passed, why = _verdict(0, 500, 0)  # the default minimum still asks for non-ties
    assert not passed and "0 of 500 judged pairs are not ties" in why


def test_enough_wins_and_few_losses_pass() -> None:
    passed, why = _verdict(10, 588, 2)
    assert passed, why
    assert not _verdict(2, 95, 3)[0]  # 5 informative pairs: below the minimum
    assert not _verdict(5, 80, 15)[0]  # a real loss: the bound is far below -0.02


def test_the_score_bound_is_the_bonferroni_wilson_pair() -> None:
    low, high = score_bound(np.zeros(8), 0.95)
    assert low == pytest.approx(-high) and low == pytest.approx(-0.3857, abs=1e-3)
    low, _ = score_bound(np.r_[np.zeros(99), -1.0], 0.95)
    assert -0.07 < low < -0.06  # one loss in 100 reaches past -0.02
    assert np.isnan(score_bound(np.zeros(0), 0.95)).all()


def test_a_gate_never_uses_the_point_estimate_as_its_bound() -> None:
    nan = float("nan")
    q = Quality(1, 0, 0, 0, {}, *([Estimate(0.0, nan, nan, 1)] * 6), informative=1)
    v = verdict(_row(q), GATE)
    assert not v.passed and "no interval can be computed from 1 judged pair" in v.reasons[0]
