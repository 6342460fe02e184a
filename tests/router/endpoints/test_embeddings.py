"""POST /v1/embeddings (router/endpoints/embeddings.py) through the real proxy with the official
client: passed to `embeddings.tier` unrouted, charged by input tokens through the budget gate,
traced; and the 404 that lists the endpoints for any unknown path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import hash_key
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.proxy import ProxyThread, make_config, tier

KEYS = {"rich": "sk-test-embed-rich", "poor": "sk-test-embed-poor"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    tmp: Path = tmp_path_factory.mktemp("embeddings")
    prefix = random_prefix()
    with running_echo_upstream() as upstream:
        config = make_config(
            [tier("small", upstream), tier("embed", upstream, price=(2.0, 50.0))],
            tmp,
            auth={"required": True},
            keys=[{"key_sha256": hash_key(k), "team": team} for team, k in KEYS.items()],
            teams={
                "rich": {"budget": {"limit_usd": 10, "period": "daily"}},
                "poor": {"budget": {"limit_usd": 0.000001, "period": "daily"}},
            },
            default_policy="fixed",
            policies={"fixed": {"type": "fixed", "tier": "small"}},
            budgets={"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
            embeddings={"tier": "embed"},
        )
        with ProxyThread(config) as running:
            yield running
    delete_prefix(prefix)


def client(proxy: ProxyThread, team: str = "rich") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEYS[team], max_retries=0)


def test_embeddings_pass_through_charged_by_input_tokens(proxy: ProxyThread) -> None:
    raw = client(proxy).embeddings.with_raw_response.create(
        model="text-embedding-3-small", input=["a b c", "d e"]
    )
    answer = raw.parse()
    assert [d.index for d in answer.data] == [0, 1] and answer.data[0].embedding[0] == 3.0
    assert answer.usage.prompt_tokens == 5
    assert raw.headers["x-router-tier"] == "embed" and "x-router-score" not in raw.headers
    # 5 input tokens at $2 per million; nothing for completion (there is none).
    assert raw.headers["x-router-cost-usd"] == "0.000010000"
    record = next(r for r in proxy.traces(1) if r["id"] == raw.headers["x-router-request-id"])
    assert (record["tier"], record["model"], record["reason"]) == (
        "embed",
        "echo",
        "embeddings.tier",
    )
    assert record["requested_model"] == "text-embedding-3-small" and record["policy"] is None
    assert record["endpoint"] == "embeddings"
    assert (record["prompt_tokens"], record["completion_tokens"]) == (5, 0)
    budget = httpx.get(
        f"{proxy.url}/v1/budget", timeout=10, headers={"Authorization": f"Bearer {KEYS['rich']}"}
    ).json()
    assert budget["scopes"][0]["spent_usd"] == pytest.approx(0.00001)
    assert budget["scopes"][0]["reserved_usd"] == 0  # settled, nothing left held


def test_the_budget_gate_refuses_what_does_not_fit(proxy: ProxyThread) -> None:
    with pytest.raises(openai.RateLimitError, match="budget"):
        client(proxy, "poor").embeddings.create(model="e", input="one two " * 50)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "e"}, "input"),
        ({"model": "e", "input": 5}, "input"),
        ({"model": "e", "input": []}, "input"),
        ({"model": "e", "input": "x", "stream": True}, "stream"),
        ({"model": "e", "input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x"}, "model"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(
    proxy: ProxyThread, body: dict[str, object], param: str
) -> None:
    resp = httpx.post(
        f"{proxy.url}/v1/embeddings",
        json=body,
        timeout=10,
        headers={"Authorization": f"Bearer {KEYS['rich']}"},
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_unknown_endpoints_list_the_ones_that_exist(proxy: ProxyThread) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        client(proxy).images.generate(prompt="a cat")
    message = refused.value.body["message"]  # type: ignore[index]
    assert "POST /v1/chat/completions" in message and "POST /v1/responses" in message
    other = httpx.post(f"{proxy.url}/v1/audio/speech", json={}, timeout=10)
    assert other.status_code == 404
    error = other.json()["error"]
    assert error["code"] == "not_found" and "POST /v1/embeddings" in error["message"]
    assert "/admin/" not in error["message"]
    # A known endpoint with the wrong method is still a 405.
    wrong = httpx.get(f"{proxy.url}/v1/chat/completions", timeout=10)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert httpx.get(f"{proxy.url}/admin/v1/keys/abc/revoke", timeout=10).status_code == 405


def test_without_an_embeddings_tier_the_endpoint_says_how_to_enable_it(tmp_path: Path) -> None:
    config = make_config([tier("small", "http://127.0.0.1:9/v1")], tmp_path)
    with ProxyThread(config) as proxy:
        resp = httpx.post(
            f"{proxy.url}/v1/embeddings", json={"model": "e", "input": "x"}, timeout=10
        )
    assert resp.status_code == 404 and "embeddings.tier" in resp.json()["error"]["message"]
