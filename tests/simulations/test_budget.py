"""Budgets over time: downgrades, refusals, exhaustion time, and what budget_pacing changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from simulations.budget_replay import budget_replay
from simulations.replay import ReplayError, replay, trace_scores
from simulations.sim_config import SimConfig
from simulations.trace_loader import load_trace
from tests.support.sim import balanced, sim_config, write_jsonl_trace


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    path = tmp_path_factory.mktemp("budget") / "t.jsonl"
    # 400 requests spread over ~an hour, two teams.
    write_jsonl_trace(path, 400, seed=2, rate_per_s=0.1, start=1_790_000_000.0)
    trace = load_trace([path])
    scores = trace_scores(trace, None)
    # Half the requests above the threshold, whatever the shipped model's score scale.
    threshold = float(np.median(scores))
    unlimited = replay(_config(1e9, threshold), trace, scores)
    alpha = np.asarray(trace.teams) == "alpha"
    alpha_cost = float(unlimited.cost_usd[alpha].sum())
    return trace, scores, unlimited, alpha, alpha_cost, threshold


def _config(limit: float, threshold: float, downgrade: bool = True, **sections: Any) -> SimConfig:
    return sim_config(
        threshold,
        teams={"alpha": {"budget": {"limit_usd": limit, "period": "total"}}},
        budgets={"downgrade": downgrade},
        **sections,
    )


def test_no_limit_matches_plain_replay(setup: tuple) -> None:
    trace, scores, unlimited, alpha, alpha_cost, t = setup
    tallies = budget_replay(_config(1e9, t), trace, scores)
    assert tallies["alpha"].spent_usd == pytest.approx(alpha_cost)
    assert tallies["beta"].spent_usd == pytest.approx(unlimited.cost_usd[~alpha].sum())
    assert tallies["alpha"].refused == tallies["alpha"].downgraded == 0


def test_tight_budget_downgrades_then_refuses(setup: tuple) -> None:
    trace, scores, _, alpha, alpha_cost, t = setup
    limit = alpha_cost / 3
    tallies = budget_replay(_config(limit, t), trace, scores)
    a = tallies["alpha"]
    assert a.spent_usd <= limit + 1e-12
    assert a.downgraded > 0
    assert a.first_downgrade is not None
    assert a.exhausted_at is None or a.exhausted_at >= a.first_downgrade
    assert tallies["beta"].refused == 0  # beta has no limit
    strict = budget_replay(_config(limit, t, downgrade=False), trace, scores)["alpha"]
    assert strict.downgraded == 0 and strict.refused > 0
    assert strict.exhausted_at is not None
    assert strict.spent_usd <= limit + 1e-12


def test_pacing_serves_more_requests_within_the_same_budget(setup: tuple) -> None:
    trace, scores, _, _, alpha_cost, t = setup
    limit = alpha_cost / 3
    plain = budget_replay(_config(limit, t, downgrade=False), trace, scores)["alpha"]
    paced = budget_replay(_config(limit, t, downgrade=False), trace, scores, pacing=(1.0, 0.5))[
        "alpha"
    ]
    assert paced.spent_usd <= limit + 1e-12
    assert paced.refused < plain.refused
    assert paced.served_large < plain.served_large


def test_load_shedding_threshold_policy_can_be_paced(setup: tuple) -> None:
    # Bug 2: a `threshold` policy with `load_shed` had "no threshold to pace".
    trace, scores, _, _, alpha_cost, t = setup
    limit = alpha_cost / 3
    shed = {**balanced(t), "load_shed": {"max_waiting": 4, "margin": 0.1}}
    sim = _config(limit, t, downgrade=False, policies={"shed": shed})
    plain = budget_replay(sim, trace, scores, "shed")["alpha"]
    paced = budget_replay(sim, trace, scores, "shed", pacing=(1.0, 0.5))["alpha"]
    # Without queue readings it spends as its threshold does; pacing then helps as it does there.
    assert plain == budget_replay(_config(limit, t, downgrade=False), trace, scores)["alpha"]
    assert paced.refused < plain.refused and paced.spent_usd <= limit + 1e-12
    coin = _config(limit, t, policies={"coin": {"type": "random", "p": 0.5}})
    with pytest.raises(ReplayError, match="no threshold to pace"):
        budget_replay(coin, trace, scores, "coin", pacing=(1.0, 0.5))


def test_budget_replay_needs_times_and_teams(tmp_path: Path, setup: tuple) -> None:
    from simulations.trace import TraceError

    trace, scores, *_, t = setup
    from dataclasses import replace

    with pytest.raises(TraceError, match="record 0 .*'team'"):
        budget_replay(_config(1.0, t), replace(trace, teams=None), scores)
