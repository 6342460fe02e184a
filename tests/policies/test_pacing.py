"""Budget pacing keeps a simulated team inside its budget over a whole period."""

from __future__ import annotations

import numpy as np

from policies.base import BudgetView, RoutingContext
from policies.budget_pacing import BudgetPacingPolicy
from policies.threshold import ThresholdPolicy

LIMIT = 100.0
N = 20000  # requests spread evenly over the period
COST = {"s": 0.0015, "l": 0.02}  # per request; all-small ~ 0.3 x budget, base mix ~ 2 x


def _simulate(policy, scores: np.ndarray, bursty: bool = False) -> tuple[float, float, float]:
    spent = 0.0
    spent_at_half = 0.0
    large = 0
    # A bursty team sends 60% of its traffic in the first fifth of the period.
    times = np.linspace(0, 1, N, endpoint=False)
    if bursty:
        times = np.sort(
            np.concatenate(
                [
                    np.linspace(0, 0.2, int(N * 0.6), endpoint=False),
                    np.linspace(0.2, 1, N - int(N * 0.6), endpoint=False),
                ]
            )
        )
    for score, t in zip(scores, times, strict=True):
        view = BudgetView(limit_usd=LIMIT, spent_usd=spent, reserved_usd=0.0, period_elapsed=t)
        tier = policy.decide(RoutingContext(score=float(score), team="a", budget=view)).tier
        spent += COST[tier]
        large += tier == "l"
        if t < 0.5:
            spent_at_half = spent
    return spent, spent_at_half, large / N


def test_unpaced_threshold_overspends() -> None:
    scores = np.random.default_rng(7).beta(2, 2, N)
    spent, _, _ = _simulate(ThresholdPolicy("t", "s", "l", 0.5), scores)
    assert spent > 1.5 * LIMIT


def test_pacing_stays_inside_budget_and_uses_it() -> None:
    scores = np.random.default_rng(7).beta(2, 2, N)
    pacing = BudgetPacingPolicy("p", "s", "l", threshold=0.5, max_threshold=1.0, slack=0.2)
    spent, at_half, share = _simulate(pacing, scores)
    assert spent <= LIMIT
    assert spent >= 0.9 * LIMIT  # the budget is used, not hoarded
    # The guarantee: at least (1 - slack) of the even share is left for the second half.
    assert at_half <= LIMIT * (1 - 0.8 * 0.5)
    assert 0.1 < share < 0.5


def test_pacing_survives_a_burst() -> None:
    scores = np.random.default_rng(8).beta(2, 2, N)
    pacing = BudgetPacingPolicy("p", "s", "l", threshold=0.5, max_threshold=1.0, slack=0.2)
    spent, _, _ = _simulate(pacing, scores, bursty=True)
    assert 0.9 * LIMIT <= spent <= LIMIT


def test_pacing_through_the_proxy_with_redis_budgets(tmp_path) -> None:
    """The proxy hands the team's Redis budget to the pacing policy: once the team has spent
    most of its budget (spent by another replica here), a request that went large goes small."""
    import asyncio

    import httpx

    from benchmarks.echo_upstream import running_echo_upstream
    from policies.budgets.redis_store import RedisBudgetStore
    from policies.budgets.scopes import ScopeLimits
    from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
    from tests.support.proxy import ProxyThread, make_config, tier

    prefix = random_prefix()
    with running_echo_upstream() as url:
        config = make_config(
            [tier("small", url, price=(1, 1)), tier("large", url, price=(2, 2))],
            tmp_path,
            budgets={
                "store": "redis",
                "redis_url": REDIS_URL,
                "key_prefix": prefix,
                "view_cache_s": 0,
            },
            teams={"default": {"budget": {"limit_usd": 1.0, "period": "total"}}},
            default_policy="paced",
            policies={"paced": {"type": "budget_pacing", "threshold": 0.0, "slack": 0.2}},
        )

        async def spend(usd: float) -> None:
            other_replica = RedisBudgetStore(config.budgets)
            try:
                scope = ScopeLimits(config.teams, config.keys).scope("default")
                await other_replica.reserve(scope, "elsewhere", usd, 0)
                await other_replica.settle("elsewhere", usd, 0)
            finally:
                await other_replica.aclose()

        def tier_now(http: httpx.Client) -> str:
            r = http.post(
                "/v1/chat/completions",
                json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert r.status_code == 200, r.text
            return r.headers["x-router-tier"]

        try:
            with ProxyThread(config) as proxy, httpx.Client(base_url=proxy.url, timeout=10) as http:
                assert tier_now(http) == "large"  # on pace: base threshold 0
                asyncio.run(spend(0.95))
                assert tier_now(http) == "small"  # 5% left (3% after the reserve): t = 0.937
                last = proxy.traces(expect=2)[-1]
            assert not last["downgraded"] and "< paced threshold 0.93" in last["reason"]
        finally:
            delete_prefix(prefix)
