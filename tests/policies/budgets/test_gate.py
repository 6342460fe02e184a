"""The request path's budget gate: which tiers a request may use once its reservation is made."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from policies.budgets.memory import InMemoryBudgetStore
from policies.keys import Identity
from router.config import RouterConfig, config_from_dict
from router.http.errors import RouterError
from router.proxy.budget_gate import BudgetGate

CHAT = "chat/completions"
BODY = {"model": "auto", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


def router_config(limit: float, downgrade: bool = True, **team: Any) -> RouterConfig:
    tier = {"kind": "replay", "replay_trace": "t.jsonl"}
    return config_from_dict(
        {
            "tiers": [
                {
                    **tier,
                    "name": "small",
                    "model": "s",
                    "fallback": ["large"],
                    "price": {"input_per_mtok": 1, "output_per_mtok": 1},
                },
                {
                    **tier,
                    "name": "large",
                    "model": "l",
                    "price": {"input_per_mtok": 100, "output_per_mtok": 100},
                },
            ],
            "teams": {"a": {"budget": {"limit_usd": limit, "period": "daily", **team}}},
            "budgets": {"downgrade": downgrade},
        }
    )


def gate_for(config: RouterConfig) -> BudgetGate:
    return BudgetGate(
        InMemoryBudgetStore(60), config.budgets, config.teams, config.keys, config.tiers_by_name
    )


def names(tiers: list[Any]) -> list[str]:
    return [t.name for t in tiers]


def test_the_chain_as_chosen_when_it_fits() -> None:
    config = router_config(1.0)
    gate = gate_for(config)
    small, large = config.tier("small"), config.tier("large")
    admitted = asyncio.run(gate.reserve("r1", Identity("a"), BODY, [small, large], endpoint=CHAT))
    assert names(admitted.chain) == ["small", "large"] and not admitted.downgraded


def test_a_pricier_fallback_is_dropped_when_only_the_first_tier_fits() -> None:
    config = router_config(0.005)  # small's worst case (~$0.0002) fits, large's (~$0.02) does not
    small, large = config.tier("small"), config.tier("large")
    admitted = asyncio.run(
        gate_for(config).reserve("r1", Identity("a"), BODY, [small, large], endpoint=CHAT)
    )
    assert names(admitted.chain) == ["small"] and not admitted.downgraded


def test_downgrade_to_a_cheaper_tier_of_the_policy() -> None:
    config = router_config(0.005)
    small, large = config.tier("small"), config.tier("large")
    admitted = asyncio.run(
        gate_for(config).reserve("r1", Identity("a"), BODY, [large], [small], endpoint=CHAT)
    )
    assert names(admitted.chain) == ["small"] and admitted.downgraded


def test_nothing_fits_or_downgrade_off_is_429() -> None:
    config = router_config(0.005, downgrade=False)
    small, large = config.tier("small"), config.tier("large")
    with pytest.raises(RouterError) as err:
        asyncio.run(
            gate_for(config).reserve("r1", Identity("a"), BODY, [large], [small], endpoint=CHAT)
        )
    assert err.value.status == 429 and err.value.code == "budget_exceeded"
    with pytest.raises(RouterError):
        asyncio.run(
            gate_for(router_config(0.0)).reserve(
                "r1", Identity("a"), BODY, [large], [small], endpoint=CHAT
            )
        )


def refusal(gate: BudgetGate, config: RouterConfig, request_id: str) -> RouterError:
    with pytest.raises(RouterError) as err:
        asyncio.run(
            gate.reserve(request_id, Identity("a"), BODY, [config.tier("large")], endpoint=CHAT)
        )
    assert err.value.status == 429 and err.value.code == "budget_exceeded"
    return err.value


def test_a_worst_case_above_the_whole_limit_says_so_and_has_no_retry_after() -> None:
    # large's worst case for BODY: (~100 prompt + 100) tokens x $100/M = ~$0.02 > $0.005.
    config = router_config(0.005, downgrade=False)
    err = refusal(gate_for(config), config, "r1")
    assert "retry-after" not in err.headers  # nothing was spent: no wait ever makes it fit
    assert "worst case $0.0" in err.message and "100 completion tokens" in err.message
    assert "the daily spend limit $0.005 itself" in err.message
    assert "lower max_tokens" in err.message and "raise the limit" in err.message


def test_spent_budget_says_what_is_left_and_retries_after_the_reset() -> None:
    config = router_config(0.03, downgrade=False)
    gate = gate_for(config)
    asyncio.run(gate.reserve("r1", Identity("a"), BODY, [config.tier("large")], endpoint=CHAT))
    asyncio.run(gate.settle("r1", 0.015, 100))
    err = refusal(gate, config, "r2")
    assert "what is left of the daily spend limit $0.03, $0.015" in err.message
    assert 1 <= int(err.headers["retry-after"]) <= 86400  # the daily reset


def test_held_by_requests_in_flight_retries_soon() -> None:
    config = router_config(0.03, downgrade=False)
    gate = gate_for(config)
    asyncio.run(gate.reserve("r1", Identity("a"), BODY, [config.tier("large")], endpoint=CHAT))
    err = refusal(gate, config, "r2")  # r1 holds ~$0.02 of $0.03; nothing is spent yet
    assert "held by requests in flight" in err.message
    assert err.headers["retry-after"] == "1"


def test_a_spent_total_limit_never_resets_so_no_retry_after() -> None:
    config = router_config(0.03, downgrade=False, period="total")
    gate = gate_for(config)
    asyncio.run(gate.reserve("r1", Identity("a"), BODY, [config.tier("large")], endpoint=CHAT))
    asyncio.run(gate.settle("r1", 0.015, 100))
    err = refusal(gate, config, "r2")
    assert "retry-after" not in err.headers and "never resets" in err.message


def test_rate_limits_are_not_escaped_by_downgrading() -> None:
    config = router_config(10.0, rpm=1)
    gate = gate_for(config)
    small, large = config.tier("small"), config.tier("large")

    async def main() -> None:
        await gate.reserve("r1", Identity("a"), BODY, [large], [small], endpoint=CHAT)
        with pytest.raises(RouterError) as err:
            await gate.reserve("r2", Identity("a"), BODY, [large], [small], endpoint=CHAT)
        assert err.value.code == "rate_limit_exceeded" and err.value.headers["retry-after"]

    asyncio.run(main())


def test_unbounded_requests_get_the_default_max_tokens() -> None:
    gate = gate_for(router_config(1.0))
    body = {k: v for k, v in BODY.items() if k != "max_tokens"}
    assert gate.bound_body(body, CHAT)["max_tokens"] == 1024
    assert gate.bound_body(BODY, CHAT) is BODY
