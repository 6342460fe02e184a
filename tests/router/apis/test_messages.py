"""POST /v1/messages on the echo upstream: bad input in Anthropic's error shape, the `apis:`
passthrough to a tier that speaks Messages (with prompt-cache pricing), the published schema
and the config checks. The official `anthropic` SDK and httpx over real HTTP."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest
from anthropic.types import Message, TextBlock

from backends.base import Usage
from backends.config import Price, TierConfig
from backends.json_limits import MAX_JSON_DEPTH
from backends.registry import tier_problems
from benchmarks.echo_upstream import running_echo_upstream
from policies.keys import hash_key
from router.apis.messages import MessagesApi
from tests.support.proxy import ProxyThread, make_config, tier
from tests.support.waiting import wait_for

KEY, POOR_KEY = "sk-messages-team", "sk-messages-poor"
# The passthrough tier prices cache reads at a tenth (the echo upstream caches each prompt
# for the next request of the same model, in blocks of 1 token here).
NATIVE_PRICE = Price(input_per_mtok=2.0, output_per_mtok=4.0, cached_input_per_mtok=0.2)
MAX_BODY = 65536
USER = b'"messages": [{"role": "user", "content": "x"}]}'  # the rest of a body


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyThread]:
    with running_echo_upstream("--cache-block", "1") as up:
        native = tier("native", up, apis=["chat", "messages"])
        native["price"] = NATIVE_PRICE.model_dump()
        config = make_config(
            [tier("small", up, fallback=["large"]), tier("large", up, price=(10, 30)), native],
            tmp_path_factory.mktemp("traces"),
            teams={
                "team": {"budget": {"limit_usd": 10.0, "period": "total"}},
                "poor": {"budget": {"limit_usd": 0.000001, "period": "total"}},
            },
            keys=[
                {"key_sha256": hash_key(KEY), "team": "team"},
                {"key_sha256": hash_key(POOR_KEY), "team": "poor"},
            ],
            auth={"required": True},
            server={"max_body_bytes": MAX_BODY},
        )
        with ProxyThread(config) as p:
            yield p


def sdk(proxy: ProxyThread, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0, timeout=30)


def ask(**extra: Any) -> dict[str, Any]:
    return {
        "model": "auto",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello there"}],
        **extra,
    }


def trace_of(proxy: ProxyThread, request_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        found[:] = [r for r in proxy.traces(0) if r["id"] == request_id]
        return bool(found)

    wait_for(seen, 10, f"the trace of {request_id}")
    return found[0]


def post(proxy: ProxyThread, content: bytes, **headers: str) -> httpx.Response:
    hs = {"content-type": "application/json", "x-api-key": KEY, **headers}
    return httpx.post(proxy.url + "/v1/messages", content=content, headers=hs, timeout=30)


def anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    return str(body["error"]["message"])


# --- bad input: Anthropic's error shape and status, never a 500 --------------------------------


@pytest.mark.parametrize(
    ("content", "names"),
    [
        (b"{oops", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"model": "auto", "messages": [{"role": "user", "content": "x"}]}', "max_tokens"),
        (
            b'{"model": "auto", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}',
            "max_tokens",
        ),
        (b'{"model": "auto", "max_tokens": 2147483648, ' + USER, "max_tokens"),
        (b'{"model": "auto", "max_tokens": 8, "messages": []}', "messages"),
        (
            b'{"model": "auto", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}',
            "role",
        ),
        (
            b'{"model": "auto", "max_tokens": 8, "messages": [{"role": "user", "content": 7}]}',
            "content",
        ),
        (b'{"model": "auto", "max_tokens": 8, "temperature": 1.5, ' + USER, "temperature"),
        (b'{"model": "auto", "max_tokens": 8, "stream": "yes", ' + USER, "stream"),
        (b'{"model": "auto", "max_tokens": 8, "messages": "\xc3\x28"}', "JSON"),
        (
            b'{"model": "auto", "max_tokens": 8, "x": '
            + b"[" * (MAX_JSON_DEPTH + 1)
            + b"]" * (MAX_JSON_DEPTH + 1)
            + b"}",
            "nested",
        ),
    ],
)
def test_bad_requests_get_anthropic_400s(proxy: ProxyThread, content: bytes, names: str) -> None:
    assert names in anthropic_error(post(proxy, content), 400, "invalid_request_error")


def test_limits_and_content_type_in_anthropic_shape(proxy: ProxyThread) -> None:
    big = (
        b'{"model":"auto","max_tokens":8,"messages":[{"role":"user","content":"'
        + b"a" * MAX_BODY
        + b'"}]}'
    )
    anthropic_error(post(proxy, big), 413, "request_too_large")
    r = post(proxy, b'{"model": "auto"}', **{"content-type": "text/plain"})
    assert "application/json" in anthropic_error(r, 415, "invalid_request_error")


def test_a_refused_head_is_in_anthropic_shape_too(proxy: ProxyThread) -> None:
    """The server's protocol refuses an oversized head before any route runs (431)."""
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: x\r\n"
        with contextlib.suppress(OSError):  # the server may close before it was all sent
            sock.sendall(head + b"x-big: " + b"a" * (100 * 1024) + b"\r\n\r\n")
        answer = b""
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    body = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


def test_the_sdk_raises_its_own_errors(proxy: ProxyThread) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        sdk(proxy).messages.create(**ask(model="router:nope"))
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        sdk(proxy, "sk-unknown").messages.create(**ask())
    with pytest.raises(anthropic.BadRequestError):
        sdk(proxy).messages.create(**ask(max_tokens=-1))
    with pytest.raises(anthropic.RateLimitError) as limited:  # the team's budget: 429
        sdk(proxy, POOR_KEY).messages.create(**ask())
    assert "budget" in limited.value.message
    r = httpx.post(
        proxy.url + "/v1/messages", json=ask(), headers={"authorization": f"Bearer {KEY}"}
    )
    assert r.status_code == 200 and r.json()["type"] == "message"  # a bearer key works too


# --- passthrough: a tier that speaks Messages gets the client's request as it is --------------


def test_a_tier_that_speaks_messages_is_passed_the_request_and_cache_reads_are_priced(
    proxy: ProxyThread,
) -> None:
    """The echo upstream answers /v1/messages itself (Anthropic's usage: the prompt split in
    fresh input and cache reads); the second ask of one prompt is read from its cache."""
    body = ask(model="native", messages=[{"role": "user", "content": "one two three four five"}])
    client = sdk(proxy)
    first = client.messages.with_raw_response.create(**body)
    second = client.messages.with_raw_response.create(**body)
    message = second.parse()
    assert isinstance(message, Message) and isinstance(message.content[0], TextBlock)
    assert message.id == "msg_echo-1"  # the upstream's own Messages answer, not a translation
    usage = message.usage
    assert usage.cache_read_input_tokens == 5 and usage.input_tokens == 0
    cost = float(second.headers["x-router-cost-usd"])
    assert cost == pytest.approx(NATIVE_PRICE.cost(5, usage.output_tokens, cached_tokens=5))
    assert float(first.headers["x-router-cost-usd"]) == pytest.approx(
        NATIVE_PRICE.cost(5, first.parse().usage.output_tokens)
    )
    record = trace_of(proxy, second.headers["x-router-request-id"])
    assert (record["endpoint"], record["upstream_endpoint"]) == ("messages", "messages")
    assert (record["prompt_tokens"], record["cached_tokens"]) == (5, 5)
    # Streamed, it is passed through too: the upstream's own events, the final message_delta
    # carrying the usage it is charged for (the cache read priced) and the router's cost.
    raw = client.messages.with_raw_response.create(**body, stream=True)
    events = list(raw.parse())
    assert [e.type for e in events][-2:] == ["message_delta", "message_stop"]
    assert events[0].type == "message_start" and events[0].message.id == "msg_echo-1"
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == " ".join(["echo"] * 8)
    final = events[-2].usage
    assert (final.input_tokens, final.cache_read_input_tokens) == (0, 5)
    cost = (final.model_extra or {})["cost_usd"]
    assert cost == pytest.approx(NATIVE_PRICE.cost(5, final.output_tokens, cached_tokens=5))
    record = trace_of(proxy, raw.headers["x-router-request-id"])
    assert (record["upstream_endpoint"], record["cached_tokens"], record["stream"]) == (
        "messages",
        5,
        True,
    )
    assert record["cost_usd"] == pytest.approx(cost)


def test_a_tool_loop_through_the_proxy_passes_tools_and_results_translated(
    proxy: ProxyThread,
) -> None:
    """The echo upstream's tool mode calls the first tool offered, echoing what it received."""
    tools = [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}]
    client = sdk(proxy)
    body = ask(model="small", tools=tools, extra_body={"echo": {"tool_rounds": 1}})
    first = client.messages.create(**body)
    assert first.stop_reason == "tool_use"
    call = first.content[0]
    assert call.type == "tool_use" and call.name == "lookup"
    # What the upstream got: the tool in chat's shape, no results yet.
    assert call.input["tools"] == [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object"}, "description": "d"},
        }
    ]
    assert call.input["tool_results"] == []
    messages = [
        *body["messages"],
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}],
        },
    ]
    second = client.messages.create(**{**body, "messages": messages})
    assert second.stop_reason == "end_turn" and second.content[0].type == "text"


# --- schema and config ------------------------------------------------------------------------


def test_the_published_schema_has_the_endpoint(proxy: ProxyThread) -> None:
    schema = httpx.get(proxy.url + "/openapi.json").json()
    op = schema["paths"]["/v1/messages"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/MessagesRequest")
    body = schema["components"]["schemas"]["MessagesRequest"]
    assert {"model", "max_tokens", "messages"} <= set(body["required"])
    assert "anthropicKey" in schema["components"]["securitySchemes"]


def test_apis_must_list_chat_and_only_http_tiers_pass_through() -> None:
    base = {
        "name": "t",
        "base_url": "http://x/v1",
        "model": "m",
        "price": {"input_per_mtok": 1, "output_per_mtok": 1},
    }
    with pytest.raises(ValueError, match="list chat too"):
        TierConfig.model_validate({**base, "apis": ["messages"]})
    assert TierConfig.model_validate(base).apis == ["chat"]
    hosted = TierConfig.model_validate({**base, "kind": "litellm", "apis": ["chat", "messages"]})
    assert [key for key, _ in tier_problems(hosted)] == ["apis"]
    assert tier_problems(TierConfig.model_validate({**base, "apis": ["chat", "messages"]})) == []


def test_an_agent_run_is_one_session_as_its_cache_breakpoints_move(proxy: ProxyThread) -> None:
    """Claude Code re-sends its system prompt and first message each turn, moving its
    `cache_control` breakpoint to the newest message: the derived session stays the run's."""
    system = [
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}
    ]
    first = {"role": "user", "content": [{"type": "text", "text": "fix the failing test"}]}
    marked = {**first, "content": [{**first["content"][0], "cache_control": {"type": "ephemeral"}}]}
    client = sdk(proxy)
    one = client.messages.with_raw_response.create(**ask(system=system, messages=[marked]))
    two = client.messages.with_raw_response.create(
        **ask(
            system=system,
            messages=[
                first,
                {"role": "assistant", "content": "Looking."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}}
                    ],
                },
            ],
        )
    )
    sessions = [
        dict(kv.split("=") for kv in r.headers["x-router-session"].split("; ")) for r in (one, two)
    ]
    assert sessions[0]["id"] == sessions[1]["id"] and sessions[0]["id"].startswith("auto-")
    assert (sessions[0]["turn"], sessions[1]["turn"]) == ("1", "2")


def test_a_chat_answer_becomes_a_message_with_thinking_text_and_tool_use() -> None:
    chat = {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "reasoning_content": "Check the file first.",
                    "content": "Reading it.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "function": {"name": "read", "arguments": '{"path": "a.py"}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
    }
    usage = Usage(10, 5, True, None, cached_tokens=4, cache_write_tokens=2)
    message = Message.model_validate(MessagesApi(None).answer(chat, usage, 0.1, native=False))
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[2].input == {"path": "a.py"} and message.stop_reason == "tool_use"
    u = message.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (4, 4, 2)
