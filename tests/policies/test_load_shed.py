"""Load shedding: borderline requests leave a queued-up large tier, and the reason says why."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import TierLoad
from policies.base import BatchContext, Policy, RoutingContext, Tunable
from policies.load_shed import LoadShedPolicy
from policies.registry import build_policies
from policies.threshold import ThresholdPolicy
from router.config import config_from_dict
from trace_format.config_base import ConfigError

PRICES = {
    "small": {"input_per_mtok": 0.6, "output_per_mtok": 0.6},
    "large": {"input_per_mtok": 10, "output_per_mtok": 30},
}


def policy(max_waiting: float = 8, margin: float = 0.1) -> LoadShedPolicy:
    return LoadShedPolicy(ThresholdPolicy("p", "small", "large", 0.5), max_waiting, margin)


def ctx(score: float, waiting: float | None) -> RoutingContext:
    load = {} if waiting is None else {"large": TierLoad(running=4, waiting=waiting)}
    return RoutingContext(score=score, load=load)


def test_borderline_request_goes_small_when_large_queue_is_over_the_limit() -> None:
    d = policy().decide(ctx(0.55, waiting=12))
    assert d.tier == "small"
    assert d.reason.startswith("load_shed:")
    assert "queue 12 > 8" in d.reason and "within 0.1 of threshold 0.5000" in d.reason


@pytest.mark.parametrize(
    ("score", "waiting", "tier"),
    [
        (0.55, 8, "large"),  # at the limit, not above it
        (0.55, 0, "large"),
        (0.55, None, "large"),  # no reading (no /metrics): plain threshold
        (0.55, float("nan"), "large"),  # a NaN reading is no reading either
        (0.65, 50, "large"),  # clearly hard: stays large even under load
        (0.60, 50, "large"),  # exactly threshold + margin is outside the band
        (0.50, 50, "small"),  # exactly at the threshold is inside it
        (0.30, 50, "small"),  # small anyway
        (0.30, 0, "small"),
    ],
)
def test_decisions(score: float, waiting: float | None, tier: str) -> None:
    assert policy().decide(ctx(score, waiting)).tier == tier


def test_hard_request_under_load_says_why_it_stayed_large() -> None:
    d = policy().decide(ctx(0.9, waiting=20))
    assert d.tier == "large" and "but score is not within 0.1" in d.reason


def test_only_the_large_tiers_queue_counts() -> None:
    busy_small = RoutingContext(score=0.55, load={"small": TierLoad(waiting=100)})
    assert policy().decide(busy_small).tier == "large"


def test_offline_batch_is_the_threshold_decision() -> None:
    scores = np.array([0.1, 0.5, 0.55, 0.9])
    assert policy().decide_batch(scores).tolist() == [0, 1, 1, 1]


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0, 1),
    st.one_of(st.none(), st.floats(0, 40)),
    st.floats(0, 20),
    st.floats(0.01, 1),
)
def test_batch_with_load_agrees_with_decide(
    score: float, waiting: float | None, limit: float, margin: float
) -> None:
    p = policy(limit, margin)
    queue = np.array([np.nan if waiting is None else waiting])
    batch = p.decide_batch(np.array([score]), BatchContext(waiting={"large": queue}))
    assert p.tiers()[int(batch[0])] == p.decide(ctx(score, waiting)).tier


def test_load_shed_is_tunable_through_its_threshold() -> None:
    """Bug 2: tune and pacing see a threshold policy with load_shed as a two-tier threshold."""
    p = policy()
    assert isinstance(p, Tunable)
    assert (p.small, p.large, p.threshold) == ("small", "large", 0.5)
    moved = p.with_threshold(0.3)
    assert isinstance(moved, LoadShedPolicy) and moved.threshold == 0.3
    assert (moved.max_waiting, moved.margin, moved.name) == (8, 0.1, "p")
    assert moved.decide(ctx(0.35, waiting=12)).tier == "small"  # in [0.3, 0.4): shed
    assert moved.decide(ctx(0.45, waiting=12)).tier == "large"


def _config(load_shed: object) -> dict:
    return {
        "tiers": [
            {"name": n, "base_url": f"http://h:{i + 8000}/v1", "model": n, "price": PRICES[n]}
            for i, n in enumerate(PRICES)
        ],
        "default_policy": "shed",
        "policies": {"shed": {"type": "threshold", "threshold": 0.4, "load_shed": load_shed}},
    }


def _built(doc: dict) -> dict[str, Policy]:
    config = config_from_dict(doc)
    return build_policies(config.policies, config.policy_env())


def test_registry_builds_load_shed_as_a_threshold_option() -> None:
    built = _built(_config({"max_waiting": 3, "margin": 0.2}))
    p = built["shed"]
    assert isinstance(p, LoadShedPolicy)
    assert p.decide(ctx(0.5, waiting=4)).tier == "small"  # 0.5 in [0.4, 0.6)
    assert p.decide(ctx(0.5, waiting=3)).tier == "large"


def test_registry_without_option_is_the_plain_threshold() -> None:
    config = _config(None)
    del config["policies"]["shed"]["load_shed"]
    assert isinstance(_built(config)["shed"], ThresholdPolicy)


@pytest.mark.parametrize(
    ("option", "key"),
    [
        ({"max_waitng": 3, "margin": 0.1}, "load_shed.max_waitng"),
        ({"max_waiting": 3, "margin": 0}, "load_shed.margin"),
        ({"max_waiting": -1, "margin": 0.1}, "load_shed.max_waiting"),
    ],
)
def test_registry_names_bad_load_shed_keys(option: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=f"policies.shed.{key}"):
        _built(_config(option))
