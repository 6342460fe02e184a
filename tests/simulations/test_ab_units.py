"""The A/B report resamples the unit that assigned the arms (issue 25, item 1; issue 23's
sessions), read from the trace's `ab_unit` / `ab_unit_id`, and refuses what it cannot compute
instead of printing zero-width intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from policies.config import ExperimentConfig
from policies.experiments import ExperimentSet, UnitContext
from simulations.ab_report import NO_VARIANCE, Unanswerable, build_report, format_table
from tests.simulations.test_ab_report import _clustered_records


def _body_user_records(seed: int = 25) -> list[dict]:
    """40 body users u0..u39 split by arm, every request sent with the one API key of user
    'ann': the trace's `user` is 'ann' everywhere, `ab_unit_id` the body user's (hashed)."""
    rng = np.random.default_rng(seed)
    out = []
    for arm, users in (("control", range(0, 20)), ("treat", range(20, 40))):
        recs = _clustered_records(arm, len(users), 5, rng)
        for r in recs:
            u = int(r["user"].rsplit("-", 1)[1]) + users.start
            r.update(user="ann", ab_unit="user", ab_unit_id=f"h:{u:016x}")
        out += recs
    return out


def test_the_report_clusters_by_the_traced_unit_not_the_keys_user() -> None:
    recs = _body_user_records()
    rep = build_report(recs, "exp", unit="user")
    assert rep.unit == "user" and "recorded in the traces (ab_unit)" in rep.unit_source
    assert {a.arm: a.units for a in rep.arms} == {"control": 20, "treat": 20}
    for arm in rep.arms:
        for metric in ("traffic", "large_share", "cost_per_1k", "latency_p50", "feedback"):
            est = getattr(arm, metric)
            assert est.low < est.high, (arm.arm, metric)  # never zero-width
    table = format_table(rep)
    assert "40 users, cluster bootstrap" in table
    assert next(line for line in table.splitlines() if line.startswith("users")).split() == [
        "users",
        "20",
        "20",
    ]


def test_older_traces_with_the_keys_user_are_refused_with_the_reason() -> None:
    legacy = [{k: v for k, v in r.items() if not k.startswith("ab_")} for r in _body_user_records()]
    with pytest.raises(Unanswerable) as exc:
        build_report(legacy, "exp", unit="user")
    message = str(exc.value)
    assert "user 'ann' has requests in 2 arms (control, treat)" in message
    assert "`user` is the API key's user" in message and "body's `user`" in message
    # Told to treat requests as independent, it does (and says so).
    rep = build_report(legacy, "exp", unit="request")
    assert rep.unit == "request" and "asked for" in rep.unit_source


def test_fewer_than_two_units_in_an_arm_is_refused() -> None:
    recs = [r for r in _body_user_records() if r["ab_unit_id"] in ("h:0000000000000000",)]
    recs += [r for r in _body_user_records() if r["arm"] == "treat"]
    with pytest.raises(Unanswerable, match="arm 'control' has 1 user .* fewer than 2 per arm"):
        build_report(recs, "exp", unit="user")
    one_request = [recs[0], *[r for r in recs if r["arm"] == "treat"]]
    with pytest.raises(Unanswerable, match="arm 'control' has 1 request"):
        build_report(one_request, "exp", unit="request")


def test_no_variance_gives_no_interval_and_no_p_value() -> None:
    recs = _body_user_records()
    for r in recs:  # every request on the small tier, at one cost, in both arms
        r.update(tier="small", cost_usd=0.0005, latency_ms=100.0, feedback=0.5)
    for unit in ("user", "request"):
        rep = build_report(recs, "exp", unit=unit, large_tier="large")
        for c in rep.comparisons:
            assert math.isnan(c.diff.low) and math.isnan(c.p_value), (unit, c.metric)
            assert c.note == NO_VARIANCE, (unit, c.metric)
        for arm in rep.arms:
            for metric in ("cost_per_1k", "latency_p50", "feedback"):
                assert math.isnan(getattr(arm, metric).low), (unit, metric)  # not [m, m]
        table = format_table(rep)
        assert "<0.0001" not in table and f"({NO_VARIANCE})" in table


def test_sessions_are_a_unit_recorded_or_read_from_older_traces() -> None:
    rng = np.random.default_rng(23)
    recs = _clustered_records("control", 12, 6, rng) + _clustered_records("treat", 12, 6, rng)
    for r in recs:
        r["session"] = f"auto-{r['user']}"
    legacy = build_report(recs, "exp", unit="session")
    assert legacy.unit == "session" and {a.units for a in legacy.arms} == {12}
    assert "read from the trace field 'session'" in legacy.unit_note
    traced = [{**r, "ab_unit": "session", "ab_unit_id": r["session"]} for r in recs]
    rep = build_report(traced, "exp")  # no config: the traces say
    assert rep.unit == "session" and rep.unit_note == ""
    assert rep.arms == legacy.arms
    # Half the records from before ab_unit: a session id is in both, read from each.
    half = traced[::2] + recs[1::2]
    mixed = build_report(half, "exp")
    assert mixed.unit == "session" and f"{len(recs) // 2} records from before" in mixed.unit_note


def test_a_unit_that_changed_while_the_experiment_ran_is_refused() -> None:
    recs = _body_user_records()
    recs[0] = {**recs[0], "ab_unit": "team", "ab_unit_id": "alpha"}
    with pytest.raises(Unanswerable, match="assigned by team and by user"):
        build_report(recs, "exp")


def test_assignment_names_its_unit_and_hashes_personal_values() -> None:
    config = ExperimentConfig.model_validate(
        {
            "name": "e",
            "unit": "user",
            "arms": {"a": {"policy": "p", "weight": 1}, "b": {"policy": "q", "weight": 1}},
        }
    )
    experiments = ExperimentSet([config])
    got = experiments.assign(UnitContext(team="t", user="ann@example.com"), now=0.0)
    assert got is not None and got.unit == "user"
    assert got.unit_id.startswith("h:") and "ann" not in got.unit_id and len(got.unit_id) == 18
    again = experiments.assign(UnitContext(team="other", user="ann@example.com"), now=1.0)
    assert again is not None and again.unit_id == got.unit_id  # the same user, the same id
    by_team = ExperimentSet([config.model_copy(update={"unit": "team"})])
    team = by_team.assign(UnitContext(team="alpha"), now=0.0)
    assert team is not None and (team.unit, team.unit_id) == ("team", "alpha")


def test_a_metric_that_one_unit_of_an_arm_carries_gets_no_difference_interval() -> None:
    """Feedback from a single control user: the bootstrap has no spread between control users
    to resample, so a difference interval would be the treatment arm's spread alone."""
    recs = _body_user_records()
    rater = next(r["ab_unit_id"] for r in recs if r["arm"] == "control")
    for r in recs:
        if r["arm"] == "control" and r["ab_unit_id"] != rater:
            r.pop("feedback")
    rep = build_report(recs, "exp", unit="user")
    by_metric = {c.metric: c for c in rep.comparisons}
    feedback = by_metric["feedback"]
    assert math.isnan(feedback.diff.low) and math.isnan(feedback.p_value)
    assert not math.isnan(feedback.diff.value)
    assert feedback.note == "not computed: 1 user with a value in arm 'control', fewer than 2"
    control = next(a for a in rep.arms if a.arm == "control")
    assert math.isnan(control.feedback.low) and control.feedback.n == 5  # one user's 5 ratings
    for metric in ("large_share", "cost_per_1k", "latency_p50_ms"):
        assert by_metric[metric].diff.low < by_metric[metric].diff.high, metric
    assert f"({feedback.note})" in format_table(rep)
