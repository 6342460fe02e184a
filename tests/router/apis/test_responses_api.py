"""`POST /v1/responses` over real HTTP: the official openai client -> the proxy -> the echo
upstream (fast; the llama.cpp path is tests/router/apis/test_responses_llama.py). The request is
routed as the chat request it translates to, the answer and the stream come back as the SDK's
typed objects, tool calls make the function-call loop, and every refusal is OpenAI's error JSON
with its status, never a 500."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseStreamEvent
from pydantic import TypeAdapter

from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import hash_key
from router.apis.responses import ResponsesApi, events_of
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.waiting import wait_for
from trace_format.request_text import request_text, responses_as_chat, upstream_text

KEY = "sk-test-responses"
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    with (
        running_echo_upstream("--tool-rounds", "1") as upstream,
        running_echo_upstream("--chunk-delay-ms", "150", "--chunks", "6") as slow,
    ):
        config = make_config(
            [
                tier("small", upstream, price=(1, 2)),
                tier("large", upstream, price=(10, 30)),
                tier("slow", slow),
                tier("native", upstream, price=(1, 2), apis=["chat", "responses"]),
            ],
            tmp_path_factory.mktemp("traces"),
            teams={"agents": {"budget": {"limit_usd": 10.0, "period": "total"}}},
            keys=[{"key_sha256": hash_key(KEY), "team": "agents"}],
            auth={"required": True},
            default_policy="scored",
            policies={"scored": {"type": "threshold", "small": "small", "large": "large"}},
            server={"max_body_bytes": 64 * 1024},
        )
        with ProxyThread(config) as p:
            yield p


@pytest.fixture()
def client(proxy: ProxyThread) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0, timeout=30)


def post(proxy: ProxyThread, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"authorization": f"Bearer {KEY}", "content-type": "application/json", **headers}
    return httpx.post(proxy.url + "/v1/responses", content=content, headers=h, timeout=30)


def test_a_response_is_routed_charged_and_traced(client: OpenAI, proxy: ProxyThread) -> None:
    before = proxy.spent_usd(KEY)
    raw = client.responses.with_raw_response.create(
        model="auto", input="Say hi", instructions="Be brief.", max_output_tokens=16, store=True
    )
    response = raw.parse()
    assert isinstance(response, Response) and response.status == "completed"
    assert response.output_text.startswith("echo")
    assert response.store is False  # accepted, not stored: nothing to fetch later
    assert response.usage is not None and response.usage.input_tokens > 0
    assert response.usage.output_tokens > 0
    headers = raw.headers
    assert headers["x-router-tier"] in ("small", "large") and headers["x-router-policy"]
    cost = float(headers["x-router-cost-usd"])
    assert cost > 0 and response.usage.model_extra["cost_usd"] == pytest.approx(cost)  # type: ignore[index]
    wait_for(lambda: abs(proxy.spent_usd(KEY) - before - cost) < 1e-9, 10, "the cost charged")
    record = proxy.trace(headers["x-router-request-id"])
    assert record["endpoint"] == "responses" and record["upstream_endpoint"] == "chat/completions"
    assert record["status"] == 200 and record["cost_usd"] == pytest.approx(cost)
    assert record["prompt_tokens"] == response.usage.input_tokens


def test_a_stream_is_the_events_the_sdk_expects(client: OpenAI, proxy: ProxyThread) -> None:
    events = list(client.responses.create(model="small", input="Say hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text and text.startswith("echo")
    assert final.usage is not None and final.usage.model_extra["cost_usd"] > 0  # type: ignore[index]
    # The SDK's accumulating helper agrees.
    with client.responses.stream(model="small", input="Say hi") as stream:
        assert stream.get_final_response().output_text == text


@pytest.mark.parametrize("stream", [False, True])
def test_the_function_call_loop(client: OpenAI, proxy: ProxyThread, stream: bool) -> None:
    """Step 1 calls the tool (as function_call items, with argument deltas when streamed);
    step 2 sends its output back and gets the answer."""
    ask: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    if stream:
        events_stream = client.responses.create(model="small", input=ask, tools=TOOLS, stream=True)
        events = list(events_stream)
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" in kinds
        assert "response.function_call_arguments.done" in kinds
        first = events[-1].response  # type: ignore[union-attr]
        first_id = events_stream.response.headers["x-router-request-id"]
    else:
        raw_first = client.responses.with_raw_response.create(model="small", input=ask, tools=TOOLS)
        first, first_id = raw_first.parse(), raw_first.headers["x-router-request-id"]
    calls = [o for o in first.output if isinstance(o, ResponseFunctionToolCall)]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    arguments = json.loads(calls[0].arguments)  # the echo upstream says what it was sent
    assert arguments["tools"][0]["function"]["name"] == "get_weather"
    follow = [
        *ask,
        *first.output,
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
    ]
    raw = client.responses.with_raw_response.create(model="small", input=follow, tools=TOOLS)
    second = raw.parse()
    assert second.status == "completed" and second.output_text.startswith("echo")
    assert not [o for o in second.output if isinstance(o, ResponseFunctionToolCall)]
    # The agent run is one session: the second step is the next turn of the first's.
    record = proxy.trace(raw.headers["x-router-request-id"])
    assert record["endpoint"] == "responses" and record["session"]
    assert record["session"] == proxy.trace(first_id)["session"]
    assert raw.headers["x-router-session"].startswith(f"id={record['session']};")


@pytest.mark.parametrize("tools", [False, True], ids=["text", "function_call"])
def test_every_event_and_answer_validates_against_the_sdks_models(
    proxy: ProxyThread, tools: bool
) -> None:
    """The SDK parses leniently (it constructs without validating); its pydantic models, asked
    to validate, accept every event and answer as they are: no field missing or mistyped."""
    body: dict[str, Any] = {"model": "small", "input": "Weather in Paris?", "max_output_tokens": 16}
    if tools:
        body["tools"] = TOOLS
    plain = post(proxy, body)
    Response.model_validate(plain.json())
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", proxy.url + "/v1/responses", json={**body, "stream": True}, headers=headers
    ) as r:
        raw = r.read()
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_python(e) for e in events_of(raw)]
    assert events[-1].type == "response.completed"
    if tools:
        assert {"response.function_call_arguments.delta", "response.output_item.done"} <= {
            e.type for e in events
        }


@pytest.mark.parametrize("stream", [False, True])
def test_a_tier_that_speaks_responses_is_sent_the_request_as_it_is(
    client: OpenAI, proxy: ProxyThread, stream: bool
) -> None:
    """`apis: [chat, responses]`: the client's own request goes to the tier's /v1/responses;
    its answer (or its events, as they come) goes back with the usage it is charged for."""
    before = proxy.spent_usd(KEY)
    body: dict[str, Any] = {"model": "native", "input": "Say hi", "max_output_tokens": 16}
    if stream:
        events_stream = client.responses.create(**body, stream=True)
        events = list(events_stream)
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-1].type == "response.completed"
        final, rid = events[-1].response, events_stream.response.headers["x-router-request-id"]  # type: ignore[union-attr]
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert final.output_text == text
        assert final.usage is not None
        cost = final.usage.model_extra["cost_usd"]  # type: ignore[index]
    else:
        raw = client.responses.with_raw_response.create(**body)
        final, rid = raw.parse(), raw.headers["x-router-request-id"]
        cost = float(raw.headers["x-router-cost-usd"])
    assert final.id == "resp_echo-1" and final.output_text.startswith("echo")  # the tier's own
    assert final.usage is not None and final.usage.output_tokens == 8
    assert final.usage.model_extra["cost_usd"] == pytest.approx(cost)  # type: ignore[index]
    wait_for(lambda: abs(proxy.spent_usd(KEY) - before - cost) < 1e-9, 10, "the cost charged")
    record = proxy.trace(rid)
    assert record["upstream_endpoint"] == "responses" and record["tier"] == "native"
    assert record["completion_tokens"] == 8 and record["cost_usd"] == pytest.approx(cost)


def test_the_text_scored_is_the_translated_chat_requests() -> None:
    body: dict[str, Any] = {
        "model": "auto",
        "instructions": "You are terse.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "summary": []},
            {"role": "user", "content": "And tomorrow?"},
        ],
    }
    chat = ResponsesApi().to_chat(json.loads(json.dumps(body)))
    image = responses_as_chat(body)
    for turns in (0, 2, 4):
        assert request_text(image, turns) == request_text(chat, turns)
    assert upstream_text(image) == upstream_text(chat)


def test_previous_response_id_is_refused_clearly(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="small", input="hi", previous_response_id="resp_123")
    assert err.value.status_code == 400
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == "previous_response_id"
    assert "stores no responses" in body["message"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "small"}, 400, "input"),
        ({"model": "small", "input": []}, 400, "input"),
        ({"model": "small", "input": [{"type": "reasoning"}]}, 400, "input"),
        ({"model": "small", "input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"model": "small", "input": "hi", "max_output_tokens": 2**31}, 400, "max_output_tokens"),
        ({"model": "small", "input": "hi", "stream": "yes"}, 400, "stream"),
        ({"model": "small", "input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools.0"),
        ({"model": "small", "input": "hi", "background": True}, 400, "background"),
        ({"model": "small", "input": [{"type": "function_call", "call_id": "c"}]}, 400, None),
        ({"model": "router:no-such-policy", "input": "hi"}, 404, "model"),
        ([1, 2], 400, None),
    ],
)
def test_bad_input_gets_openais_error_with_its_status(
    proxy: ProxyThread, body: Any, status: int, param: str | None
) -> None:
    r = post(proxy, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert (error["param"] or "").startswith(param), error


def test_the_limits_are_chats(proxy: ProxyThread) -> None:
    assert post(proxy, b"{not json").status_code == 400
    assert post(proxy, b"\xff\xfe").status_code == 400
    deep: Any = "x"
    for _ in range(200):
        deep = [deep]
    r = post(proxy, {"model": "small", "input": "hi", "metadata": {"a": "b"}, "deep": deep})
    assert r.status_code == 400 and "nested" in r.json()["error"]["message"]
    big = post(proxy, {"model": "small", "input": "x" * (70 * 1024)})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    r = post(proxy, {"model": "small", "input": "hi"}, **{"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["param"] == "content-type"
    assert (
        post(proxy, {"model": "small", "input": "hi"}, authorization="Bearer nope").status_code
        == 401
    )
    r = httpx.get(proxy.url + "/v1/responses", timeout=10)
    assert r.status_code == 405


def test_the_stream_is_relayed_as_it_comes(proxy: ProxyThread) -> None:
    """Each upstream chunk is translated as it arrives: with 150 ms between the echo's chunks,
    the first text delta reaches the client long before the stream ends."""
    body = {"model": "slow", "input": "one two three four", "stream": True}
    h = {"authorization": f"Bearer {KEY}"}
    seen: list[tuple[float, bytes]] = []
    t0 = time.perf_counter()
    with httpx.stream("POST", proxy.url + "/v1/responses", json=body, headers=h, timeout=30) as r:
        for chunk in r.iter_raw():
            seen.append((time.perf_counter() - t0, chunk))
    raw = b"".join(c for _, c in seen)
    kinds = [e["type"] for e in events_of(raw)]
    assert kinds[-1] == "response.completed"
    first_delta = next(t for t, c in seen if b"response.output_text.delta" in c)
    assert seen[-1][0] - first_delta > 0.4, [round(t, 2) for t, _ in seen]
