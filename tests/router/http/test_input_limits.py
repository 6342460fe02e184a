"""Out-of-range numbers in a request are a client error naming the field, never a 500: token and
choice counts are bounded so a reservation always fits the budget store's integers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.echo_upstream import running_echo_upstream
from policies.budgets.money import MAX_NANOS, usd_to_nanos
from policies.keys import hash_key
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix
from tests.support.proxy import ProxyThread, make_config, tier

LIMITED, UNLIMITED = "sk-test-limits-limited", "sk-test-limits-unlimited"
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    tmp: Path = tmp_path_factory.mktemp("input-limits")
    prefix = random_prefix()
    with running_echo_upstream() as upstream:
        config = make_config(
            [tier("small", upstream, price=(1, 2)), tier("large", upstream, price=(30, 60))],
            tmp,
            auth={"required": True},
            teams={"capped": {"budget": {"limit_usd": 5, "period": "daily"}}, "open": {}},
            keys=[
                {"key_sha256": hash_key(LIMITED), "team": "capped"},
                {"key_sha256": hash_key(UNLIMITED), "team": "open"},
            ],
            budgets={"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
        )
        with ProxyThread(config) as running:
            yield running
    delete_prefix(prefix)


def _post(proxy: ProxyThread, endpoint: str, key: str, **fields: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": "large", **fields}
    if endpoint == "chat/completions":
        body["messages"] = [{"role": "user", "content": "hello"}]
    else:
        body["prompt"] = "hello"
    return httpx.post(
        f"{proxy.url}/v1/{endpoint}",
        json=body,
        timeout=30,
        headers={"authorization": f"Bearer {key}"},
    )


OUT_OF_RANGE = [
    ("chat/completions", "max_tokens", INT64_MAX),
    ("chat/completions", "max_tokens", 2**31),
    ("chat/completions", "max_completion_tokens", INT64_MAX),
    ("chat/completions", "n", 10**6),
    ("chat/completions", "seed", 2**63),
    ("completions", "max_tokens", INT64_MAX),
    ("completions", "max_tokens", 2**64 - 1),
    ("completions", "best_of", INT64_MAX),
    ("completions", "n", 129),
]


@pytest.mark.parametrize(("endpoint", "field", "value"), OUT_OF_RANGE)
@pytest.mark.parametrize("key", [UNLIMITED, LIMITED])
def test_out_of_range_numbers_are_a_client_error_naming_the_field(
    proxy: ProxyThread, endpoint: str, field: str, value: int, key: str
) -> None:
    r = _post(proxy, endpoint, key, **{field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_request"
    assert err["param"] == field and field in err["message"]


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_the_largest_accepted_request_is_reserved_without_overflow(
    proxy: ProxyThread, endpoint: str
) -> None:
    """max_tokens at its bound x 128 choices on the priciest tier: the worst case ($16M, clamped to
    MAX_NANOS, about $9M) fits the store; an unlimited team is served, a limited one refused with
    429, never a 500."""
    most = {"max_tokens": 2**31 - 1, "n": 128}
    if endpoint == "completions":
        most["best_of"] = 128
    served = _post(proxy, endpoint, UNLIMITED, **most)
    assert served.status_code == 200, served.text
    refused = _post(proxy, endpoint, LIMITED, **most)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    # Both released or settled: nothing is left reserved for either team.
    assert _post(proxy, endpoint, LIMITED, max_tokens=8).status_code == 200


def test_amounts_past_the_store_range_are_clamped_not_overflowed() -> None:
    assert usd_to_nanos(1e30) == MAX_NANOS and usd_to_nanos(-1e30) == -MAX_NANOS
    assert usd_to_nanos(float("inf")) == MAX_NANOS
    assert MAX_NANOS * 1000 < INT64_MAX  # a thousand such reservations still fit Redis's counters
    with pytest.raises(ValueError):
        usd_to_nanos(float("nan"))
