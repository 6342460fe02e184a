"""Replay through the real classifier and policies; bad inputs give errors naming the record."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from policies.base import RoutingContext
from policies.random_split import RandomPolicy
from simulations.replay import ReplayError, replay, sweep_inputs, trace_scores, two_tier_policy
from simulations.sweep import sweep
from simulations.trace import TraceError
from simulations.trace_loader import load_trace
from tests.support.sim import GSM8K, balanced, sim_config, write_jsonl_trace


@pytest.fixture(scope="module")
def gsm8k() -> tuple:
    config = sim_config()
    trace = load_trace([GSM8K])
    return config, trace, trace_scores(trace, config.model_path)


def test_replay_cost_and_quality_follow_the_chosen_tier(gsm8k: tuple) -> None:
    config, trace, scores = gsm8k
    t = float(np.median(scores))
    res = replay(sim_config(threshold=t), trace, scores)
    large = scores >= t
    assert (np.asarray(res.tiers)[res.tier_idx] == np.where(large, "large", "small")).all()
    # GSM8K answers are counted from each model's own recorded response.
    completion = np.where(large, trace.completion_tokens[:, 1], trace.completion_tokens[:, 0])
    expected = (
        np.where(
            large,
            trace.prompt_tokens * 10 + completion * 30,
            (trace.prompt_tokens + completion) * 0.6,
        )
        / 1e6
    )
    np.testing.assert_allclose(res.cost_usd, expected)
    np.testing.assert_allclose(
        res.quality, np.where(large, trace.quality[:, 1], trace.quality[:, 0])
    )
    assert res.summary()["share"]["large"] == pytest.approx(large.mean())
    assert (trace.completion_tokens[:, 0] != trace.completion_tokens[:, 1]).any()


def test_sweep_inputs_agree_with_replay(gsm8k: tuple) -> None:
    config, trace, scores = gsm8k
    inp = sweep_inputs(config.prices, trace, scores, two_tier_policy(config, None))
    res = sweep(inp, np.array([0.1, 0.2]))
    for k, t in enumerate((0.1, 0.2)):
        r = replay(sim_config(threshold=t), trace, scores)
        assert res.cost_per_1k[k] == pytest.approx(r.cost_usd.mean() * 1000)
        assert res.quality[k] == pytest.approx(r.quality.mean())


def test_empty_trace(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceError, match="empty trace"):
        load_trace([empty])


def _trace_with(path: Path, n: int, edit: Callable[[list[dict[str, Any]]], object]) -> Path:
    """A real n-request trace file after `edit` broke its records."""
    records = write_jsonl_trace(path, n)
    edit(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_missing_fields_name_the_line(tmp_path: Path) -> None:
    path = _trace_with(tmp_path / "t.jsonl", 5, lambda r: r[3].pop("prompt"))
    with pytest.raises(TraceError, match=r"t.jsonl: line 4: missing field 'prompt'"):
        load_trace([path])
    path = _trace_with(tmp_path / "t.jsonl", 5, lambda r: r[2]["outcomes"].pop("large"))
    with pytest.raises(TraceError, match=r"line 3: missing field 'outcomes.large'"):
        load_trace([path])


def test_missing_completion_tokens_name_the_record(tmp_path: Path) -> None:
    path = _trace_with(tmp_path / "t.jsonl", 4, lambda r: r[1].pop("completion_tokens"))
    with pytest.raises(TraceError, match=r"record 1 .*completion_tokens"):
        load_trace([path])
    assert load_trace([path], default_completion_tokens=7).completion_tokens[1, 0] == 7


def test_unsorted_timestamps_are_put_in_time_order(tmp_path: Path) -> None:
    # A proxy writes records as requests finish (issue 25, item 5): the loader sorts by arrival
    # time, and each record keeps its file row in errors.
    path = _trace_with(tmp_path / "t.jsonl", 6, lambda r: r[4].update(time=r[1]["time"]))
    trace = load_trace([path])
    assert (np.diff(trace.require_times()) >= 0).all()
    assert trace.names is not None and "row 5" in str(trace.names[2])
    # A trace put together out of order is still refused, naming the record.
    backwards = trace.take(np.arange(len(trace))[::-1])
    with pytest.raises(TraceError, match=r"record \d+ \(t row \d+\): timestamps are not sorted"):
        backwards.require_times()


def test_load_shedding_threshold_policy_is_tunable(gsm8k: tuple) -> None:
    # Bug 2: a `threshold` policy with `load_shed` had "no single threshold to sweep".
    config, trace, scores = gsm8k
    shed = {**balanced(0.4), "load_shed": {"max_waiting": 4, "margin": 0.1}}
    sim = sim_config(policies={"shed": shed})
    policy = two_tier_policy(sim, "shed")
    assert policy.tiers() == ["small", "large"]
    inp = sweep_inputs(sim.prices, trace, scores, policy)
    ref = sweep_inputs(config.prices, trace, scores, two_tier_policy(config, None))
    np.testing.assert_array_equal(inp.cost_large, ref.cost_large)
    # Offline (no queue readings) it decides as its threshold does.
    shed_tiers = replay(sim, trace, scores, "shed").tier_idx
    np.testing.assert_array_equal(shed_tiers, replay(sim_config(0.4), trace, scores).tier_idx)
    with pytest.raises(ReplayError, match="no single threshold"):
        two_tier_policy(sim_config(policies={"coin": {"type": "random", "p": 0.5}}), "coin")


def test_random_policy_draws_per_request_id(tmp_path: Path) -> None:
    # Bug 3: the replay draws on each request's id, as the proxy does, not on its row number.
    records = write_jsonl_trace(tmp_path / "t.jsonl", 300)
    trace = load_trace([tmp_path / "t.jsonl"])
    assert trace.ids == [r["id"] for r in records]
    sim = sim_config(policies={"coin": {"type": "random", "p": 0.4, "seed": "s"}})
    scores = np.zeros(len(trace))  # a random policy ignores scores
    res = replay(sim, trace, scores, "coin")
    got = [res.tiers[i] for i in res.tier_idx]
    proxy = RandomPolicy("coin", "small", "large", 0.4, "s")
    assert got == [proxy.decide(RoutingContext(score=0.0, unit=r["id"])).tier for r in records]
    # Another order of the same requests: the same decision for each id.
    reordered = trace.take(np.arange(len(trace))[::-1])
    again = replay(sim, reordered, scores, "coin")
    assert [again.tiers[i] for i in again.tier_idx] == got[::-1]


def test_policy_tier_without_outcomes_is_refused(gsm8k: tuple) -> None:
    _, trace, scores = gsm8k
    sim = sim_config(
        prices={"small": (0.6, 0.6), "mid": (2, 2), "large": (10, 30)},
        policies={"mid": {"type": "fixed", "tier": "mid"}},
    )
    with pytest.raises(ReplayError, match=r"record 0 .*chose tier 'mid'"):
        replay(sim, trace, scores, "mid")
    with pytest.raises(ReplayError, match="unknown policy 'nope'"):
        replay(sim, trace, scores, "nope")
