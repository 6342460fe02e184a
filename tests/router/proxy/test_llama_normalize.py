"""What a llama.cpp tier's server is known to reject is normalized before it is sent, and an
answer that says the request itself is invalid is neither fallen back on nor retried
(backends/normalize.py; issue 25, item 9). The official `openai` client, with its default
retries, -> the proxy over real HTTP -> a real llama-cpp-python server behind both tiers (as
the demo: `launch.engine: llama_cpp`), and the fault upstream for counting upstream hits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from openai import OpenAI

from benchmarks.fault_upstream import running_fault_upstream
from tests.support.proxy import ProxyThread, gguf_path, llama_server, make_config, tier
from tests.support.waiting import wait_for

pytest.importorskip("llama_cpp")

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
# The tool round trip as the openai client's users send it: the assistant turn that called the
# tool has `content: null` (what the API itself returns for it), then the tool's answer.
ROUND_TRIP: list[Any] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


def llama_tier(name: str, url: str, fallback: str, **extra: Any) -> dict[str, Any]:
    """A tier whose server is llama.cpp, said as the demo says it: its launch profile."""
    port = urlsplit(url).port
    launch = {"engine": "llama_cpp", "model": gguf_path(), "port": port}
    return tier(name, url, fallback=[fallback], launch=launch, **extra)


def two_tiers(url: str) -> list[dict[str, Any]]:
    return [
        llama_tier("small", url, "large", price=(0.6, 0.6), model="smol"),
        llama_tier("large", url, "small", price=(10, 30), model="smol"),
    ]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llama_server("smol", tmp_path_factory.mktemp("llama")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def proxy(llama: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    with ProxyThread(make_config(two_tiers(llama), tmp_path_factory.mktemp("traces"))) as p:
        yield p


@pytest.fixture()
def client(proxy: ProxyThread) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key="unused", timeout=120)  # default retries


def test_tool_round_trip_with_null_content_is_answered(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="small", max_tokens=8, messages=ROUND_TRIP, tools=TOOLS
    )
    assert raw.headers["x-router-tier"] == "small"
    assert "x-router-fallback-from" not in raw.headers
    answer = raw.parse()
    assert answer.choices[0].message.content is not None


def test_streamed_round_trip_and_other_shapes_the_server_refuses(client: OpenAI) -> None:
    """Each of these is a 500 from llama-cpp-python 0.3.36 sent as is."""
    shapes: list[list[Any]] = [
        [{"role": "developer", "content": "Answer briefly."}, ROUND_TRIP[0]],
        [
            {"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]},
            ROUND_TRIP[0],
        ],
        [{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
    ]
    for messages in shapes:
        chat = client.chat.completions.create(
            model="small", max_tokens=4, messages=messages, temperature=None
        )
        assert chat.choices[0].message.content is not None, messages
    stream = client.chat.completions.create(
        model="small", max_tokens=8, messages=ROUND_TRIP, tools=TOOLS, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_max_completion_tokens_bounds_the_answer(client: OpenAI) -> None:
    """The server ignores max_completion_tokens (it generated 341 tokens for a bound of 3): the
    proxy charged the bound but the server ran on (and a shadow or judge call was not bounded)."""
    chat = client.chat.completions.create(
        model="small",
        max_completion_tokens=3,
        messages=[{"role": "user", "content": "Tell me a long story about the sea."}],
    )
    # What the server generated, not the usage (the proxy caps a usage above the bound).
    assert chat.choices[0].finish_reason == "length"
    assert len(chat.choices[0].message.content or "") < 40, chat.choices[0].message.content


def test_a_request_the_server_calls_invalid_is_a_400_on_one_tier(
    client: OpenAI, proxy: ProxyThread
) -> None:
    """What normalizing cannot fix (a response_format this server does not know): its
    validation's 500 is recognised, so the client gets a 400 and the other tier is not tried."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="small",
            max_tokens=4,
            messages=[ROUND_TRIP[0]],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": {"type": "object"}},
            },
        )
    assert refused.value.code == "upstream_client_error"
    request_id = refused.value.response.headers["x-router-request-id"]

    def traced() -> dict[str, Any] | None:
        return next((r for r in proxy.traces(0) if r["id"] == request_id), None)

    wait_for(traced, timeout_s=10, what="the refused request's trace")
    record = traced()
    assert record is not None
    assert record["tiers_tried"] == ["small"] and record["status"] == 400


def test_an_invalid_request_answer_is_not_retried_anywhere(tmp_path: Path) -> None:
    """Upstream hits counted: one. Before, the 500 fell back to the other tier and the client's
    two retries of the 502 made six."""
    with (
        running_fault_upstream() as url,
        ProxyThread(make_config(two_tiers(url), tmp_path)) as proxy,
    ):
        client = OpenAI(base_url=proxy.url + "/v1", api_key="unused", timeout=30)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="small",
                max_tokens=4,
                messages=ROUND_TRIP,
                metadata={"fault": "llama_validation_500"},
            )
        assert refused.value.status_code == 400
        message = str(refused.value)
        assert "validation" not in message and "app.py" not in message  # no internals
        stats = httpx.get(url.removesuffix("/v1") + "/stats", timeout=10).json()
        assert stats["served"] == 1, stats
        with pytest.raises(openai.BadRequestError):  # a stream: refused before its first byte
            client.chat.completions.create(
                model="small",
                max_tokens=4,
                messages=ROUND_TRIP,
                stream=True,
                metadata={"fault": "llama_validation_500"},
            )
        stats = httpx.get(url.removesuffix("/v1") + "/stats", timeout=10).json()
        assert stats["served"] == 2, stats
        # A 500 that is not a validation error is still the tier's failure: it falls back.
        once = OpenAI(base_url=proxy.url + "/v1", api_key="unused", timeout=30, max_retries=0)
        with pytest.raises(openai.InternalServerError) as failed:
            once.chat.completions.create(
                model="small",
                max_tokens=4,
                messages=[ROUND_TRIP[0]],
                metadata={"fault": "error_500"},
            )
        assert failed.value.status_code == 502
        stats = httpx.get(url.removesuffix("/v1") + "/stats", timeout=10).json()
        assert stats["served"] == 4, stats  # small, then its fallback large
