"""A request whose worst case can never fit its team's limit, through the real proxy: the 429
says what the worst case is and what to change, has no Retry-After (no wait helps) and names no
tier (nothing was sent anywhere)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from benchmarks.echo_upstream import running_echo_upstream
from tests.support.proxy import ProxyThread, make_config, tier


def test_a_request_above_the_whole_limit_is_told_why_without_retry_after(tmp_path: Path) -> None:
    with running_echo_upstream() as upstream:
        cfg = make_config(
            [tier("large", upstream, price=(100.0, 100.0))],
            tmp_path,
            teams={"default": {"budget": {"limit_usd": 0.05, "period": "daily"}}},
        )
        body = {
            "model": "auto",
            "max_tokens": 1000,  # ~$0.1 worst case
            "messages": [{"role": "user", "content": "hi"}],
        }
        with ProxyThread(cfg) as proxy:
            r = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=10)
            assert r.status_code == 429
            err = r.json()["error"]
            assert err["code"] == "budget_exceeded", err
            assert "worst case $0.1" in err["message"]
            assert "1000 completion tokens from max_tokens" in err["message"]
            assert "the daily spend limit $0.05 itself" in err["message"]
            assert "lower max_tokens" in err["message"]
            assert "retry-after" not in r.headers
            assert "x-router-tier" not in r.headers
            assert r.headers["x-router-request-id"]
            # A request that fits is served, and names its tier.
            ok = httpx.post(
                f"{proxy.url}/v1/chat/completions", timeout=10, json={**body, "max_tokens": 10}
            )
            assert ok.status_code == 200 and ok.headers["x-router-tier"] == "large"


@pytest.mark.parametrize(
    ("bound", "source"),
    [
        # No bound in the body: the proxy reserves for (and sends upstream) the configured
        # default, and the refusal must say so rather than blame a max_tokens the client never set.
        ({}, "from budgets.default_max_tokens (the request sets no max_completion_tokens or"),
        ({"max_completion_tokens": 1000}, "from max_completion_tokens)"),
        ({"max_tokens": 10, "max_completion_tokens": 1000}, "from max_completion_tokens)"),
    ],
)
def test_a_refusal_names_where_its_token_bound_came_from(
    tmp_path: Path, bound: dict[str, int], source: str
) -> None:
    with running_echo_upstream() as upstream:
        cfg = make_config(
            [tier("large", upstream, price=(100.0, 100.0))],
            tmp_path,
            teams={"default": {"budget": {"limit_usd": 0.05, "period": "daily"}}},
            budgets={"default_max_tokens": 1000},
        )
        with ProxyThread(cfg) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="none", max_retries=0)
            with pytest.raises(openai.RateLimitError) as refused:
                client.chat.completions.create(
                    model="auto", messages=[{"role": "user", "content": "hi"}], **bound
                )
            message = refused.value.body["message"]  # type: ignore[index]
            assert refused.value.body["code"] == "budget_exceeded", message  # type: ignore[index]
            assert f"1000 completion tokens {source}" in message
            assert "from max_tokens" not in message
