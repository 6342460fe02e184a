"""Context windows (issue 23, item 4): a request the chosen tier cannot hold goes to the cheapest
tier that can, with the reason in the trace and the headers, and never reaches a tier too small
for it; none can, or the client named one that cannot: one OpenAI-style 400
`context_length_exceeded` naming the limit and the counts. The real proxy in front of one echo
upstream per tier (so what each tier was sent is counted by that server), driven by the
official openai client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from benchmarks.echo_upstream import running_echo_upstream
from policies.context_window import context_need
from tests.support.ports import free_port
from tests.support.proxy import ProxyThread, make_config, tier

SMALL_WINDOW = 400
LARGE_WINDOW = 2_000
MAX_TOKENS = 16


def messages(chars: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": ("word " * (chars // 5 + 1))[:chars]}]


def need(msgs: list[dict[str, str]]) -> int:
    """The tokens the router counts for these messages: the reservation's bytes estimate."""
    body = {"model": "auto", "messages": msgs, "max_tokens": MAX_TOKENS}
    return context_need(body, "chat/completions", 1024, "bytes").tokens


SHORT = messages(20)
LONG = messages(1_000)  # over the small tier's window, within the large one's
HUGE = messages(5_000)  # over both


@dataclass
class Setup:
    proxy: ProxyThread
    client: openai.OpenAI
    upstreams: dict[str, str]

    def served(self, tier_name: str) -> int:
        """Requests the tier's own echo server answered."""
        root = self.upstreams[tier_name].removesuffix("/v1")
        return int(httpx.get(f"{root}/stats", timeout=5).json()["served"])


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    # threshold 1.0: the policy sends every request small, so only the window moves one.
    policies = {"auto": {"type": "threshold", "threshold": 1.0}}
    with ExitStack() as stack:
        urls = {n: stack.enter_context(running_echo_upstream()) for n in ("small", "large")}
        cfg = make_config(
            [
                tier("small", urls["small"], price=(0.5, 0.5), context_window=SMALL_WINDOW),
                tier("large", urls["large"], price=(10.0, 30.0), context_window=LARGE_WINDOW),
            ],
            tmp_path,
            policies=policies,
            default_policy="auto",
        )
        proxy = stack.enter_context(ProxyThread(cfg))
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        yield Setup(proxy, client, urls)


def test_fixture_sizes_are_what_the_tests_mean() -> None:
    assert need(SHORT) <= SMALL_WINDOW < need(LONG) <= LARGE_WINDOW < need(HUGE)


def test_over_long_prompts_land_on_the_large_tier_with_zero_upstream_errors(setup: Setup) -> None:
    answers = []
    for msgs in (SHORT, LONG, LONG, SHORT, LONG):
        raw = setup.client.chat.completions.with_raw_response.create(
            model="auto", messages=msgs, max_tokens=MAX_TOKENS
        )
        answers.append((raw.headers, raw.parse()))
    with setup.client.chat.completions.with_streaming_response.create(
        model="auto", messages=LONG, max_tokens=MAX_TOKENS, stream=True
    ) as streamed:
        assert streamed.headers["x-router-tier"] == "large"
        assert streamed.headers["x-router-context-window"] == "moved from small"
        chunks = list(streamed.iter_lines())
    assert any("[DONE]" in c for c in chunks)
    tiers = [h["x-router-tier"] for h, _ in answers]
    assert tiers == ["small", "large", "large", "small", "large"]
    assert [h.get("x-router-context-window") for h, _ in answers] == [
        None,
        "moved from small",
        "moved from small",
        None,
        "moved from small",
    ]
    assert all(a.choices[0].message.content for _, a in answers)
    # What each tier's own server was sent: the small one never saw an over-long prompt.
    assert setup.served("small") == 2
    assert setup.served("large") == 4
    traces = setup.proxy.traces(expect=6)
    assert len(traces) == 6
    assert all(t["status"] == 200 and t["error"] is None for t in traces)
    moved = [t for t in traces if t["tier"] == "large"]
    assert len(moved) == 4
    for t in moved:
        assert t["tiers_tried"] == ["large"]
        assert "context_window" in t["reason"]
        assert f"up to {need(LONG)} tokens, small holds {SMALL_WINDOW}" in t["reason"]
        assert t["reason"].endswith("moved to large")
    assert not any("context_window" in (t["reason"] or "") for t in traces if t["tier"] == "small")


def test_none_fits_is_one_400_naming_the_limit_and_the_counts(setup: Setup) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        setup.client.chat.completions.create(model="auto", messages=HUGE, max_tokens=MAX_TOKENS)
    err = caught.value
    assert err.status_code == 400
    assert err.code == "context_length_exceeded"
    body: Any = err.body
    assert body["type"] == "invalid_request_error" and body["param"] == "messages"
    tokens = need(HUGE)
    assert f"maximum context length is {LARGE_WINDOW} tokens" in err.message
    assert f"you requested {tokens} tokens ({tokens - MAX_TOKENS} in the messages, " in err.message
    assert f"{MAX_TOKENS} in the completion" in err.message
    assert "tried: small, large" in err.message
    assert setup.served("small") == 0 and setup.served("large") == 0
    (trace,) = setup.proxy.traces(expect=1)
    assert trace["status"] == 400 and trace["error"] == "context_length_exceeded"
    assert trace["tiers_tried"] == []


def test_a_named_tier_too_small_is_refused_not_moved(setup: Setup) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        setup.client.chat.completions.create(model="small", messages=LONG, max_tokens=MAX_TOKENS)
    err = caught.value
    assert err.code == "context_length_exceeded"
    assert f"maximum context length is {SMALL_WINDOW} tokens" in err.message
    assert "the tier named (small)" in err.message
    # Named and large enough: served there, untouched.
    ok = setup.client.chat.completions.with_raw_response.create(
        model="large", messages=LONG, max_tokens=MAX_TOKENS
    )
    assert ok.headers["x-router-tier"] == "large"
    assert "x-router-context-window" not in ok.headers
    assert setup.served("small") == 0 and setup.served("large") == 1


def test_max_tokens_counts_toward_the_window(setup: Setup) -> None:
    """A short prompt whose completion bound alone overflows the small tier moves too; the
    default bound (budgets.default_max_tokens, 1024) counts when the client sets none."""
    big = SMALL_WINDOW
    raw = setup.client.chat.completions.with_raw_response.create(
        model="auto", messages=SHORT, max_tokens=big
    )
    assert raw.headers["x-router-tier"] == "large"
    unbounded = setup.client.chat.completions.with_raw_response.create(model="auto", messages=SHORT)
    assert unbounded.headers["x-router-tier"] == "large"
    assert setup.served("small") == 0


def test_a_budget_downgrade_never_lands_on_a_tier_too_small(tmp_path: Path) -> None:
    """The context window outranks a budget downgrade: a request the large tier's budget cannot
    afford is downgraded only to a tier that holds it; none does: the budget's own 429."""
    with ExitStack() as stack:
        urls = {n: stack.enter_context(running_echo_upstream()) for n in ("small", "large")}
        cfg = make_config(
            [
                tier("small", urls["small"], price=(1.0, 1.0), context_window=SMALL_WINDOW),
                tier("large", urls["large"], price=(100.0, 100.0)),
            ],
            tmp_path,
            policies={"auto": {"type": "threshold", "threshold": 0.0}},  # always large
            default_policy="auto",
            teams={"default": {"budget": {"limit_usd": 0.01, "period": "daily"}}},
            budgets={"downgrade": True},
        )
        proxy = stack.enter_context(ProxyThread(cfg))
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        setup = Setup(proxy, client, urls)
        short = client.chat.completions.with_raw_response.create(
            model="auto", messages=SHORT, max_tokens=MAX_TOKENS
        )
        assert short.headers["x-router-tier"] == "small"
        assert short.headers["x-router-downgraded"] == "true"
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="auto", messages=LONG, max_tokens=MAX_TOKENS)
        assert caught.value.code == "budget_exceeded"
        assert setup.served("small") == 1 and setup.served("large") == 0


def test_a_fallback_too_small_is_not_tried(tmp_path: Path) -> None:
    """The large tier is down and falls back to the small one: a request the small tier holds
    falls back; one it cannot hold gets the large tier's failure, not a small tier's 400."""
    with running_echo_upstream() as small_url:
        dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
        cfg = make_config(
            [
                tier("small", small_url, price=(1.0, 1.0), context_window=SMALL_WINDOW),
                tier("large", dead, price=(10.0, 10.0), fallback=["small"]),
            ],
            tmp_path,
            policies={"auto": {"type": "threshold", "threshold": 0.0}},  # always large
            default_policy="auto",
        )
        with ProxyThread(cfg) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
            setup = Setup(proxy, client, {"small": small_url})
            short = client.chat.completions.with_raw_response.create(
                model="auto", messages=SHORT, max_tokens=MAX_TOKENS
            )
            assert short.headers["x-router-tier"] == "small"
            assert short.headers["x-router-fallback-from"] == "large"
            with pytest.raises(openai.APIStatusError) as caught:
                client.chat.completions.create(model="auto", messages=LONG, max_tokens=MAX_TOKENS)
            assert caught.value.status_code == 503
            assert setup.served("small") == 1
            traces = proxy.traces(expect=2)
    assert sorted(t["tiers_tried"] for t in traces) == [["large"], ["large", "small"]]
