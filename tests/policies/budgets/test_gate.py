"""The request path's budget gate: which tiers a request may use once its reservation is made."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from policies.budgets.memory import InMemoryBudgetStore
from policies.keys import Identity
from router.budget_gate import BudgetGate
from router.config import RouterConfig, config_from_dict
from router.errors import RouterError

BODY = {"model": "auto", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


def config(limit: float, downgrade: bool = True, **team: Any) -> RouterConfig:
    tier = {"kind": "replay", "replay_trace": "t.jsonl"}
    return config_from_dict({
        "tiers": [
            {**tier, "name": "small", "model": "s", "fallback": ["large"],
             "price": {"input_per_mtok": 1, "output_per_mtok": 1}},
            {**tier, "name": "large", "model": "l",
             "price": {"input_per_mtok": 100, "output_per_mtok": 100}},
        ],
        "teams": {"a": {"budget": {"limit_usd": limit, "period": "daily", **team}}},
        "budgets": {"downgrade": downgrade},
    })


def gate_for(cfg: RouterConfig) -> BudgetGate:
    return BudgetGate(InMemoryBudgetStore(60), cfg.budgets, cfg.teams, cfg.keys, cfg.tiers)


def names(tiers: list[Any]) -> list[str]:
    return [t.name for t in tiers]


def test_the_chain_as_chosen_when_it_fits() -> None:
    cfg = config(1.0)
    gate = gate_for(cfg)
    small, large = cfg.tier("small"), cfg.tier("large")
    admitted = asyncio.run(gate.reserve("r1", Identity("a"), BODY, [small, large]))
    assert names(admitted.chain) == ["small", "large"] and not admitted.downgraded


def test_a_pricier_fallback_is_dropped_when_only_the_first_tier_fits() -> None:
    cfg = config(0.005)  # small's worst case (~$0.0002) fits, large's (~$0.02) does not
    small, large = cfg.tier("small"), cfg.tier("large")
    admitted = asyncio.run(gate_for(cfg).reserve("r1", Identity("a"), BODY, [small, large]))
    assert names(admitted.chain) == ["small"] and not admitted.downgraded


def test_downgrade_to_a_cheaper_tier_of_the_policy() -> None:
    cfg = config(0.005)
    small, large = cfg.tier("small"), cfg.tier("large")
    admitted = asyncio.run(gate_for(cfg).reserve("r1", Identity("a"), BODY, [large], [small]))
    assert names(admitted.chain) == ["small"] and admitted.downgraded


def test_nothing_fits_or_downgrade_off_is_429_with_retry_after() -> None:
    cfg = config(0.005, downgrade=False)
    small, large = cfg.tier("small"), cfg.tier("large")
    with pytest.raises(RouterError) as err:
        asyncio.run(gate_for(cfg).reserve("r1", Identity("a"), BODY, [large], [small]))
    assert err.value.status == 429 and err.value.code == "budget_exceeded"
    assert 1 <= int(err.value.headers["retry-after"]) <= 86400
    with pytest.raises(RouterError):
        asyncio.run(gate_for(config(0.0)).reserve("r1", Identity("a"), BODY, [large], [small]))


def test_rate_limits_are_not_escaped_by_downgrading() -> None:
    cfg = config(10.0, rpm=1)
    gate = gate_for(cfg)
    small, large = cfg.tier("small"), cfg.tier("large")

    async def main() -> None:
        await gate.reserve("r1", Identity("a"), BODY, [large], [small])
        with pytest.raises(RouterError) as err:
            await gate.reserve("r2", Identity("a"), BODY, [large], [small])
        assert err.value.code == "rate_limit_exceeded" and err.value.headers["retry-after"]

    asyncio.run(main())


def test_unbounded_requests_get_the_default_max_tokens() -> None:
    gate = gate_for(config(1.0))
    body = {k: v for k, v in BODY.items() if k != "max_tokens"}
    assert gate.bound_body(body)["max_tokens"] == 1024
    assert gate.bound_body(BODY) is BODY
