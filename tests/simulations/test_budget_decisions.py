"""`simulate --budgets` decides each request as the headline replay does (issue 25, item 3): a
calibrating policy's threshold in force, not its starting one, and the context-window rule."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from simulations.budget_replay import budget_replay
from simulations.replay import replay, trace_scores
from simulations.trace_loader import load_trace
from tests.support.sim import sim_config, write_jsonl_trace


def _calibrating(start: float) -> dict[str, object]:
    return {
        "type": "threshold",
        "small": "small",
        "large": "large",
        "target_large_share": 0.5,
        "calibrate": {"start_threshold": start, "warmup_requests": 40, "every_n_requests": 10},
    }


@pytest.fixture(scope="module")
def trace_and_scores(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    path = tmp_path_factory.mktemp("budget-decisions") / "t.jsonl"
    write_jsonl_trace(path, 400, seed=5, rate_per_s=0.1, start=1_790_000_000.0)
    trace = load_trace([path])
    return trace, trace_scores(trace, None)


def test_a_calibrating_policy_sends_the_same_requests_large_with_and_without_budgets(
    trace_and_scores: tuple,
) -> None:
    trace, scores = trace_and_scores
    # Started where nearly everything goes large: only calibration brings the share to 50%.
    start = float(np.quantile(scores, 0.05))
    sim = sim_config(policies={"cal": _calibrating(start)})
    headline = replay(sim, trace, scores, "cal")
    large = round(headline.summary()["share"]["large"] * len(trace))
    assert 0.3 < large / len(trace) < 0.7  # calibrated, not the start's ~95%
    tallies = budget_replay(sim, trace, scores, "cal")  # no team has a limit
    assert sum(t.served_large for t in tallies.values()) == large
    assert sum(t.spent_usd for t in tallies.values()) == pytest.approx(headline.cost_usd.sum())


def test_the_context_window_rule_applies_before_the_budget(trace_and_scores: tuple) -> None:
    trace, scores = trace_and_scores
    needs = np.asarray(trace.prompt_tokens) + np.asarray(trace.completion_tokens).max(axis=1)
    # Everything small by the policy, but half of it does not fit the small tier's window.
    sim = replace(sim_config(1.0), context_windows={"small": int(np.median(needs))})
    headline = replay(sim, trace, scores)
    moved = int(headline.summary()["context_window_moved"])
    assert moved > 0
    tallies = budget_replay(sim, trace, scores)
    assert sum(t.served_large for t in tallies.values()) == moved
