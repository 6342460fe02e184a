"""A/B report statistics on synthetic traces with known truth. The `ab report|assign` commands are
tested in tests/router/commands/test_ab_cli.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from simulations.ab_report import (
    ReportError,
    Unanswerable,
    build_report,
    format_table,
    load_experiment,
    to_dict,
)

PRICE = {"small": 0.0005, "large": 0.01}  # USD per request
LAT = {"small": 100.0, "large": 400.0}


def _records(
    arm: str, n: int, p_large: float, rng: np.random.Generator, fb_mean: float, start: int = 0
) -> list[dict]:
    out = []
    for i in range(n):
        tier = "large" if rng.random() < p_large else "small"
        out.append(
            {
                "schema_version": 1,
                "id": f"{arm}-{start + i}",
                "time": float(i),
                "experiment": "exp",
                "arm": arm,
                "policy": arm,
                "tier": tier,
                "prompt_tokens": 100,
                "completion_tokens": 100,
                "cost_usd": PRICE[tier],
                "latency_ms": float(rng.exponential(LAT[tier])),
                "status": 200,
                "feedback": float(np.clip(rng.normal(fb_mean, 0.2), 0, 1)),
            }
        )
    return out


def test_detects_real_difference_and_cis_cover_truth() -> None:
    rng = np.random.default_rng(5)
    recs = _records("control", 3000, 0.2, rng, 0.6) + _records("treat", 3000, 0.4, rng, 0.7)
    rep = build_report(recs, "exp")
    assert rep.control == "control" and rep.large_tier == "large"
    arms = {a.arm: a for a in rep.arms}
    for arm, p in (("control", 0.2), ("treat", 0.4)):
        est = arms[arm].large_share
        assert est.low <= p <= est.high
        true_cost = 1000 * (p * PRICE["large"] + (1 - p) * PRICE["small"])
        assert arms[arm].cost_per_1k.low <= true_cost <= arms[arm].cost_per_1k.high
        assert arms[arm].latency_p50.low < arms[arm].latency_p50.value < arms[arm].latency_p50.high
    assert arms["treat"].traffic.low <= 0.5 <= arms["treat"].traffic.high
    diffs = {c.metric: c for c in rep.comparisons}
    assert set(diffs) == {
        "large_share",
        "cost_per_1k",
        "latency_p50_ms",
        "latency_p95_ms",
        "feedback",
    }
    for metric in ("large_share", "cost_per_1k", "feedback", "latency_p95_ms"):
        assert diffs[metric].p_value < 0.001, metric
        assert diffs[metric].diff.low > 0, metric
    assert diffs["large_share"].diff.low <= 0.2 <= diffs["large_share"].diff.high
    table = format_table(rep)
    assert "share to large" in table and "treat - control" in table and "Welch t" in table


def test_sample_ratio_check() -> None:
    rng = np.random.default_rng(3)
    recs = _records("a", 1000, 0.3, rng, 0.5) + _records("b", 1000, 0.3, rng, 0.5)
    ok = build_report(recs, "exp", weights={"a": 1, "b": 1})
    assert ok.srm_p is not None and ok.srm_p > 0.001
    bad = build_report(recs, "exp", weights={"a": 1, "b": 3})
    assert bad.srm_p is not None and bad.srm_p < 0.001
    assert "MISMATCH" in format_table(bad) and "(ok)" in format_table(ok)
    with pytest.raises(ReportError, match=r"arms \['b'\] that the config does not list"):
        build_report(recs, "exp", weights={"a": 1})


def test_identical_arms_not_significant() -> None:
    rng = np.random.default_rng(1)
    recs = _records("a", 2000, 0.3, rng, 0.5) + _records("b", 2000, 0.3, rng, 0.5)
    rep = build_report(recs, "exp")
    assert rep.control == "a"
    for c in rep.comparisons:
        assert c.p_value > 0.001, c.metric
        assert c.diff.low <= 0 <= c.diff.high or c.metric.startswith("latency"), c.metric


def test_feedback_file_overrides_and_errors_excluded_from_latency() -> None:
    recs = [
        {
            "id": "1",
            "experiment": "exp",
            "arm": "a",
            "tier": "small",
            "cost_usd": 0.001,
            "latency_ms": 10.0,
            "status": 200,
            "prompt_tokens": 1,
            "completion_tokens": 1,
        },
        {
            "id": "2",
            "experiment": "exp",
            "arm": "a",
            "tier": "small",
            "cost_usd": 0.0,
            "latency_ms": 9000.0,
            "status": 502,
        },
    ]
    rep = build_report(recs, "exp", feedback={"1": 0.25}, large_tier="large")
    arm = rep.arms[0]
    assert arm.requests == 2 and arm.latency_p50.value == 10.0
    assert arm.feedback.value == 0.25 and arm.feedback.n == 1
    assert arm.cost_per_1k.value == pytest.approx(0.5)
    with pytest.raises(ReportError, match="no traced requests"):
        build_report([], "exp")


def _write(path: Path, recs: list[dict]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))


def test_reads_through_the_one_trace_reader(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    recs = _records("a", 20, 0.3, rng, 0.5)
    _write(tmp_path / "requests.jsonl", recs)
    # The JSON keeps the keys it always had for an estimate: value, lo, hi, n.
    est = to_dict(build_report(load_experiment([tmp_path], "exp"), "exp"))["arms"][0]["traffic"]
    assert set(est) == {"value", "lo", "hi", "n"} and est["n"] == 20
    _write(tmp_path / "requests.jsonl", [*recs, {**recs[0], "schema_version": 99}])
    with pytest.raises(ReportError, match=r"requests.jsonl: line 21: .*schema_version 99"):
        load_experiment([tmp_path], "exp")
    with pytest.raises(ReportError, match="trace file not found"):
        load_experiment([tmp_path / "nope.jsonl"], "exp")


def _clustered_records(
    arm: str, users: int, per_user: int, rng: np.random.Generator, user_prefix: str | None = None
) -> list[dict]:
    """Requests of `users` users assigned whole to `arm`; each user's own large share, cost level
    and latency level vary a lot between users (as real users' traffic does)."""
    out = []
    for u in range(users):
        p_user = rng.beta(0.6, 1.4)  # mean 0.3, very spread between users
        slow = rng.lognormal(0.0, 0.6)
        for i in range(per_user):
            tier = "large" if rng.random() < p_user else "small"
            out.append(
                {
                    "schema_version": 1,
                    "id": f"{arm}-{u}-{i}",
                    "time": float(i),
                    "experiment": "exp",
                    "arm": arm,
                    "tier": tier,
                    "user": f"{user_prefix or arm}-user-{u}",
                    "prompt_tokens": 100,
                    "completion_tokens": 100,
                    "cost_usd": PRICE[tier],
                    "latency_ms": float(rng.exponential(LAT[tier] * slow)),
                    "status": 200,
                    "feedback": float(np.clip(rng.normal(0.3 + 0.5 * p_user, 0.1), 0, 1)),
                }
            )
    return out


def _width(e) -> float:  # noqa: ANN001 - an Estimate
    return e.high - e.low


def test_user_assignment_gets_a_cluster_bootstrap_with_wider_intervals() -> None:
    # Issue 16: with users as the unit, requests are not independent; per-request intervals were
    # too narrow. 40 users per arm, 50 requests each, arms identical in truth.
    rng = np.random.default_rng(16)
    recs = _clustered_records("control", 40, 50, rng) + _clustered_records("treat", 40, 50, rng)
    naive = build_report(recs, "exp", unit="request")
    clustered = build_report(recs, "exp", unit="user")
    assert naive.unit == "request" and clustered.unit == "user"
    n_arms = {a.arm: a for a in naive.arms}
    for arm in clustered.arms:
        assert arm.units == 40 and arm.requests == 2000
        for metric in ("large_share", "cost_per_1k", "feedback", "latency_p50"):
            ratio = _width(getattr(arm, metric)) / _width(getattr(n_arms[arm.arm], metric))
            assert ratio > 2.0, (arm.arm, metric, ratio)
            est = getattr(arm, metric)
            assert est.low <= est.value <= est.high, (arm.arm, metric)
    n_diff = {c.metric: c for c in naive.comparisons}
    for c in clustered.comparisons:
        assert c.test == "cluster bootstrap"
        assert _width(c.diff) > 2.0 * _width(n_diff[c.metric].diff), c.metric
    table = format_table(clustered)
    assert "assignment unit user (the experiment's unit in the config)" in table
    assert "80 users, cluster bootstrap" in table


def test_cluster_interval_matches_the_true_spread_between_experiments() -> None:
    # The interval must be about as wide as the estimate really varies between experiments:
    # rerun the same experiment 200 times (fresh users) and measure the large share's spread.
    rng = np.random.default_rng(7)
    shares = []
    for _ in range(200):
        p_user = rng.beta(0.6, 1.4, size=40)
        shares.append(rng.binomial(50, p_user).sum() / 2000)
    true_half_width = 1.96 * float(np.std(shares))
    recs = _clustered_records("control", 40, 50, rng) + _clustered_records("treat", 40, 50, rng)
    clustered = build_report(recs, "exp", unit="user").arms[0].large_share
    naive = build_report(recs, "exp", unit="request").arms[0].large_share
    assert 0.6 < (_width(clustered) / 2) / true_half_width < 1.6
    assert (_width(naive) / 2) / true_half_width < 0.5  # what the report used to claim


def test_the_unit_is_inferred_from_the_traces_without_a_config() -> None:
    rng = np.random.default_rng(3)
    recs = _clustered_records("control", 20, 10, rng) + _clustered_records("treat", 20, 10, rng)
    rep = build_report(recs, "exp")
    assert rep.unit == "user" and "inferred from the traces" in rep.unit_source
    assert "traces from before the assignment unit was recorded" in rep.unit_note
    # One team per arm, the coarsest pure field: if teams were the unit, no interval exists.
    teams = [{**r, "team": r["arm"]} for r in recs]
    with pytest.raises(Unanswerable, match="arm 'control' has 1 team .* fewer than 2 per arm"):
        build_report(teams, "exp")
    # Traces from before ab_unit hold no header values: refused, not resampled as requests.
    with pytest.raises(Unanswerable, match="assigns by header, whose values traces from before"):
        build_report(recs, "exp", unit="header")


def test_per_request_assignment_is_unchanged() -> None:
    # Users appear in both arms: assignment was per request, so requests are resampled as before.
    rng = np.random.default_rng(5)
    recs = _records("control", 1500, 0.2, rng, 0.6) + _records("treat", 1500, 0.4, rng, 0.7)
    with_users = [{**r, "user": f"u{i % 30}"} for i, r in enumerate(recs)]
    plain = build_report(recs, "exp")
    mixed = build_report(with_users, "exp")
    assert plain.unit == mixed.unit == "request"
    assert plain.arms == mixed.arms == build_report(recs, "exp", unit="request").arms
    assert plain.comparisons == mixed.comparisons
    assert {c.test for c in plain.comparisons} == {
        "chi-square",
        "Welch t",
        "Mood median",
        "bootstrap",
    }
    assert "intervals treat requests as independent" in format_table(plain)
