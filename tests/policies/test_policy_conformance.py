"""The checks every registered policy type passes, as scikit-learn's parametrize_with_checks runs
its estimator checks: each type in policies/registry.py SPECS is built from the example params
below (a new type without an example fails here) and must

- choose among tiers() only, which are cheapest first by price;
- decide in decide_batch exactly as decide() does, row by row, on the same request ids, budget
  view and tier queues (scores on the thresholds, NaN queue readings included);
- if Tunable: expose a threshold in [0, 1] between its small and large tier, and keep every
  other setting through with_threshold.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import TierLoad
from backends.config import Price
from policies.base import BatchContext, BudgetView, Decision, Policy, RoutingContext, Tunable
from policies.config import PolicyConfig
from policies.registry import SPECS, build_policies, session_settings
from policies.spec import PolicyEnv, price_rank
from trace_format.config_base import ConfigError

# Config order is not price order, so "cheapest first" is the policies' doing.
PRICES = {
    "large": Price(input_per_mtok=10, output_per_mtok=30),
    "small": Price(input_per_mtok=0.6, output_per_mtok=0.6),
    "medium": Price(input_per_mtok=2, output_per_mtok=6),
}
ENV = PolicyEnv(prices=PRICES, default_policy="p")

# Params per registered type (each list non-empty): defaults, every tier, every option.
EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "threshold": [
        {"threshold": 0.4},
        {},  # the classifier card's threshold
        {"threshold": 0.25, "small": "medium"},
        {"threshold": 0.55, "load_shed": {"max_waiting": 3, "margin": 0.2}},
        {"target_large_share": 0.3, "calibrate": {"start_threshold": 0.45}},  # calibrating
    ],
    "budget_pacing": [
        {"threshold": 0.3, "max_threshold": 0.9, "slack": 0.25},
        {"threshold": 0.5, "reserve": 0, "large": "medium"},
    ],
    "tiers": [
        {"thresholds": [0.3, 0.7]},
        {"tiers": ["small", "large"], "thresholds": [0.5]},
    ],
    "fixed": [{}, {"tier": "large"}],
    "random": [{"p": 0.3, "seed": "s"}, {"p": 0.0}, {"p": 1.0, "small": "medium"}],
}

CASES = [
    pytest.param(kind, params, id=f"{kind}-{i}")
    for kind, examples in EXAMPLES.items()
    for i, params in enumerate(examples)
]


def build(kind: str, params: dict[str, Any]) -> Policy:
    config = PolicyConfig.model_validate({"type": kind, **params})
    return build_policies({"p": config}, ENV)["p"]


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_every_registered_type_has_examples(kind: str) -> None:
    assert EXAMPLES.get(kind), f"add example params for policy type {kind!r} to EXAMPLES"


def test_no_example_for_an_unregistered_type() -> None:
    assert set(EXAMPLES) <= set(SPECS)


# ---- what one batch of requests sees ------------------------------------------------------


BUDGETS = st.one_of(
    st.none(),
    st.builds(
        BudgetView,
        limit_usd=st.one_of(st.none(), st.just(0.0), st.floats(0.01, 200)),
        spent_usd=st.floats(0, 300),
        reserved_usd=st.floats(0, 50),
        period_elapsed=st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0, 1)),
    ),
)


def _probes(policy: Any, budget: BudgetView | None) -> list[float]:
    """Scores where decisions differ: 0, 1 and the policy's thresholds (as configured, plus
    load shedding's band and pacing's threshold under this budget), just below each of them,
    and half way between neighbours."""
    edges = [0.0, 1.0]
    threshold = getattr(policy, "threshold", None)
    if threshold is not None:
        edges.append(threshold)
        if hasattr(policy, "margin"):
            edges.append(threshold + policy.margin)
    edges += getattr(policy, "thresholds", [])
    if hasattr(policy, "effective_threshold"):
        edges.append(policy.effective_threshold(budget))
    edges = sorted({e for e in edges if 0.0 <= e <= 1.0})
    below = [float(np.nextafter(e, -np.inf)) for e in edges if e > 0.0]
    between = [(a + b) / 2 for a, b in zip(edges, edges[1:], strict=False)]
    return edges + below + between


def _queues(policy: Any) -> st.SearchStrategy[float]:
    limit = float(getattr(policy, "max_waiting", 3))
    return st.one_of(st.just(math.nan), st.sampled_from([0.0, limit]), st.floats(0, 40))


@st.composite
def batches(draw: st.DrawFn, policy: Any) -> tuple[np.ndarray, BatchContext]:
    budget = draw(BUDGETS)
    scores = draw(
        st.lists(
            st.one_of(st.floats(0, 1), st.sampled_from(_probes(policy, budget))),
            min_size=1,
            max_size=40,
        )
    )
    n = len(scores)
    units = draw(st.lists(st.text(max_size=12), min_size=n, max_size=n))
    waiting = {
        tier: np.asarray(draw(st.lists(_queues(policy), min_size=n, max_size=n)))
        for tier in PRICES
        if draw(st.booleans())  # no entry for a tier: no reading, as an empty RoutingContext.load
    }
    return np.asarray(scores, dtype=np.float64), BatchContext(units, budget, waiting)


def row(scores: np.ndarray, ctx: BatchContext, i: int) -> RoutingContext:
    """Row i of a batch as the proxy would hand it to decide()."""
    assert ctx.units is not None
    load = {tier: TierLoad(waiting=float(w[i])) for tier, w in ctx.waiting.items()}
    return RoutingContext(score=float(scores[i]), budget=ctx.budget, load=load, unit=ctx.units[i])


def decisions(policy: Policy, scores: np.ndarray, ctx: BatchContext) -> list[Decision]:
    return [policy.decide(row(scores, ctx, i)) for i in range(len(scores))]


def assert_batch_agrees(policy: Policy, scores: np.ndarray, ctx: BatchContext) -> None:
    batch = policy.decide_batch(scores, ctx)
    tiers = policy.tiers()
    assert batch.shape == scores.shape and np.issubdtype(batch.dtype, np.integer)
    assert ((batch >= 0) & (batch < len(tiers))).all()
    single = decisions(policy, scores, ctx)
    assert all(d.tier in tiers and d.policy == policy.name for d in single)
    assert [tiers[k] for k in batch] == [d.tier for d in single]


# ---- the checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "params"), CASES)
def test_tiers_cheapest_first_by_price(kind: str, params: dict[str, Any]) -> None:
    tiers = build(kind, params).tiers()
    assert tiers and len(set(tiers)) == len(tiers) and set(tiers) <= set(PRICES)
    ranks = [price_rank(PRICES[t]) for t in tiers]
    assert ranks == sorted(ranks)


@pytest.mark.parametrize(("kind", "params"), CASES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_decide_batch_equals_decide(kind: str, params: dict[str, Any], data: st.DataObject) -> None:
    policy = build(kind, params)
    assert_batch_agrees(policy, *data.draw(batches(policy)))


@pytest.mark.parametrize(("kind", "params"), CASES)
def test_no_context_is_row_numbers_without_budget_or_load(
    kind: str, params: dict[str, Any]
) -> None:
    policy = build(kind, params)
    scores = np.random.default_rng(5).random(300)
    rows = [
        policy.decide(RoutingContext(score=float(s), unit=str(i))).tier
        for i, s in enumerate(scores)
    ]
    assert [policy.tiers()[k] for k in policy.decide_batch(scores)] == rows


@pytest.mark.parametrize(("kind", "params"), CASES)
@settings(max_examples=30, deadline=None)
@given(t=st.floats(0, 1), data=st.data())
def test_tunable_threshold_round_trips(
    kind: str, params: dict[str, Any], t: float, data: st.DataObject
) -> None:
    policy = build(kind, params)
    if not isinstance(policy, Tunable):
        return  # nothing to tune: a threshold is not part of its contract
    assert 0.0 <= policy.threshold <= 1.0
    assert policy.tiers() == [policy.small, policy.large]
    moved = policy.with_threshold(t)
    assert type(moved) is type(policy) and isinstance(moved, Tunable)
    assert (moved.name, moved.tiers(), moved.threshold) == (policy.name, policy.tiers(), t)
    scores, ctx = data.draw(batches(moved))
    assert_batch_agrees(moved, scores, ctx)  # decide == decide_batch at any threshold
    # Every other setting is kept: moving back decides exactly (reasons included) as before.
    # Only from below: a budget_pacing ceiling rises to a base above it, and stays there.
    back = policy.with_threshold(min(t, policy.threshold)).with_threshold(policy.threshold)
    assert decisions(back, scores, ctx) == decisions(policy, scores, ctx)


@pytest.mark.parametrize(("kind", "params"), CASES)
@pytest.mark.parametrize("mode", ["per_request", "sticky", "escalate_only", "cache_aware"])
def test_every_type_takes_the_session_option(kind: str, params: dict[str, Any], mode: str) -> None:
    """`session:` is every type's (policies/sessions/): it changes nothing the policy decides
    (the request path applies it), and a typo in it is an error naming the key."""
    option = {"mode": mode, "ttl_s": 120}
    with_session = {**params, "session": option}
    plain, held = build(kind, params), build(kind, with_session)
    scores = np.linspace(0, 1, 21)
    assert held.tiers() == plain.tiers()
    assert list(held.decide_batch(scores)) == list(plain.decide_batch(scores))
    config = PolicyConfig.model_validate({"type": kind, **with_session})
    assert session_settings({"p": config})["p"].mode == mode
    bad = PolicyConfig.model_validate({"type": kind, **params, "session": {"mode": "stiky"}})
    with pytest.raises(ConfigError, match=r"policies\.p\.session\.mode"):
        session_settings({"p": bad})
