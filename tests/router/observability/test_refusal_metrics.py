"""A request refused before any tier was tried names no tier in `cost_router_requests_total`,
as it names none in its `x-router-tier` header (README, docs/budgets.md: "The 429 names no
tier"). Real proxy, real echo upstream, the official openai client."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from benchmarks.echo_upstream import running_echo_upstream
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.waiting import wait_for


def test_a_budget_refusal_is_counted_without_a_tier(tmp_path: Path) -> None:
    with running_echo_upstream() as url:
        cfg = make_config(
            [tier("small", url, price=(1.0, 1.0)), tier("large", url, price=(100.0, 100.0))],
            tmp_path,
            policies={"auto": {"type": "threshold", "threshold": 0.0}},  # always large
            default_policy="auto",
            teams={"default": {"budget": {"limit_usd": 0.000001, "period": "daily"}}},
        )
        with ProxyThread(cfg) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.RateLimitError) as refused:
                client.chat.completions.create(
                    model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=64
                )
            assert refused.value.code == "budget_exceeded"
            assert "x-router-tier" not in refused.value.response.headers

            def counted() -> str | None:
                text = httpx.get(proxy.url + "/metrics").text
                lines = [
                    line
                    for line in text.splitlines()
                    if line.startswith("cost_router_requests_total{") and 'status="429"' in line
                ]
                return lines[0] if lines else None

            wait_for(counted, timeout_s=10, what="the 429 to be counted")
            line = counted()
            text = httpx.get(proxy.url + "/metrics").text
            # Nor is it a request the team sent to the large tier (its large share).
            assert 'cost_router_team_requests_total{team="default",tier="large"}' not in text
            assert line is not None and 'tier=""' in line and line.endswith(" 1.0"), line
