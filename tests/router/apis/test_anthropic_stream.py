"""The chat-stream -> Anthropic-events translation (router/apis/anthropic_stream.py) on the
relay's own bytes, parsed back with the anthropic SDK's event models: blocks open and close in
order, parallel tool calls get a block each, and the relay's usage chunk becomes message_delta's
usage."""

from __future__ import annotations

from typing import Any

import orjson
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from router.apis.anthropic_stream import MessagesStream

EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"model": "m", "choices": [choice]}) + b"\n\n"


def call(index: int, id_: str | None, name: str | None, args: str) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": args}
    if name is not None:
        function["name"] = name
    return {"tool_calls": [{"index": index, "id": id_, "function": function}]}


def parse(out: list[bytes]) -> list[Any]:
    events = []
    for part in b"".join(out).split(b"\n\n"):
        if part:
            data = orjson.loads(part.split(b"\ndata: ", 1)[1])
            # An error event is not a message event: the SDK raises on it (its body as is).
            events.append(data if data["type"] == "error" else EVENTS.validate_python(data))
    return events


def test_text_then_two_tool_calls_then_usage() -> None:
    stream = MessagesStream("msg_1", tool_names={"short": "a_very_long_tool_name"})
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 4},
        "cost_usd": 0.5,
    }
    parts = [
        chunk({"role": "assistant", "content": "Let me "}),
        chunk({"content": "look."}),
        chunk(call(0, "call_a", "short", '{"q":')),
        chunk(call(0, None, None, '"x"}')),
        chunk(call(1, "call_b", "other", "{}"), finish="tool_calls"),
        b"data: " + orjson.dumps({"model": "m", "choices": [], "usage": usage}) + b"\n\n",
        b"data: [DONE]\n\n",
    ]
    out: list[bytes] = []
    for i, part in enumerate(parts):  # split mid-event too: the rest is held until it completes
        out += stream.feed(part[:5]) + stream.feed(part[5:]) if i % 2 else stream.feed(part)
    events = parse(out)
    kinds = [e.type for e in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.index for s in starts] == [0, 1, 2]
    assert starts[1].content_block.name == "a_very_long_tool_name"  # the client's own name
    assert (starts[1].content_block.id, starts[2].content_block.id) == ("call_a", "call_b")
    json_parts = [
        (e.index, e.delta.partial_json)
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert json_parts == [(1, '{"q":'), (1, '"x"}'), (2, "{}")]
    final = events[-2]
    assert final.delta.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (6, 4)
    assert final.usage.output_tokens == 7 and final.usage.model_extra["cost_usd"] == 0.5


def test_an_error_event_ends_the_stream_without_message_stop() -> None:
    stream = MessagesStream("msg_2")
    error = {"error": {"message": "the upstream failed mid-stream (request r)", "type": "x"}}
    out = stream.feed(chunk({"content": "par"}) + b"data: " + orjson.dumps(error) + b"\n\n")
    events = parse(out)
    assert [e.type for e in events[:-1]][-1] == "content_block_stop"
    error = events[-1]["error"]
    assert error["type"] == "api_error" and "request r" in error["message"]
    assert stream.feed(b"data: [DONE]\n\n") == []  # nothing after the end


def test_a_reasoning_models_thinking_is_a_thinking_block_before_the_text() -> None:
    stream = MessagesStream("msg_3")
    parts = [
        chunk({"reasoning_content": "First, "}),
        chunk({"reasoning_content": "think."}),
        chunk({"content": "Answer."}, finish="stop"),
        b"data: [DONE]\n\n",
    ]
    events = parse([e for p in parts for e in stream.feed(p)])
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    thinking = [
        e.delta.thinking
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
    ]
    assert "".join(thinking) == "First, think."
