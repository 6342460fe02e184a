"""Unit tests of the proxy's pieces: SSE relay, trace sink rotation, token counting, errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.base import UpstreamError, Usage
from backends.config import Price
from backends.tokens import count_prompt_tokens, count_tokens
from router.http.errors import error_body
from router.observability.trace_sink import TraceSink
from router.proxy.stream_relay import EVENT_END, StreamMeter, relay, split_events
from trace_format.schema import TraceRecord

PRICE = Price(input_per_mtok=1, output_per_mtok=2)


def chunk(text: str) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    obj = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [choice],
    }
    return b"data: " + orjson.dumps(obj) + b"\r\n\r\n"


async def _pieces(data: bytes, size: int, fail: bool = False) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]
    if fail:
        raise UpstreamError("t", "connection reset")


def run_relay(
    data: bytes, size: int, want_usage: bool, fail: bool = False
) -> tuple[bytes, StreamMeter]:
    meter = StreamMeter(
        request={"messages": [{"role": "user", "content": "hi"}]}, want_usage=want_usage
    )

    async def collect() -> bytes:
        rest = _pieces(data, size, fail)
        first = await anext(rest)
        parts = [p async for p in relay(first, rest, meter, cost_of)]
        assert [last for _, last in parts] == [False] * (len(parts) - 1) + [True]
        return b"".join(data for data, _ in parts)

    return asyncio.run(collect()), meter


def cost_of(usage: Usage) -> float:
    return PRICE.cost(usage.prompt_tokens, usage.completion_tokens)


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_relay_reassembles_split_events_and_synthesises_usage(size: int) -> None:
    upstream = chunk("Hello") + chunk(" world") + b": keep-alive\n\n" + b"data: [DONE]\r\n\r\n"
    out, meter = run_relay(upstream, size, want_usage=True)
    events = [e for e in out.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
    assert events[0].startswith(b"data: ") and b"Hello" in events[0]
    assert events[2] == b": keep-alive"
    usage = orjson.loads(events[-2][6:])["usage"]
    assert usage["completion_tokens"] == count_tokens("Hello world")
    assert usage["cost_usd"] == pytest.approx(cost_of(meter.final_usage()))
    assert events[-1] == b"data: [DONE]"
    assert meter.usage is None  # nothing was reported: the usage above was counted


def test_relay_keeps_reported_usage_and_hides_it_when_not_asked() -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    tail = b"data: " + orjson.dumps({"id": "c1", "choices": [], "usage": usage}) + b"\n\n"
    out, meter = run_relay(chunk("a") + tail + b"data: [DONE]\n\n", 5, want_usage=False)
    assert b'"usage"' not in out and out.endswith(b"data: [DONE]\n\n")
    assert meter.final_usage() == Usage(11, 3, True)


def test_relay_turns_mid_stream_failure_into_error_event() -> None:
    out, meter = run_relay(chunk("partial"), 4096, want_usage=True, fail=True)
    assert meter.error == "upstream_error"
    assert b'"error"' in out and b"[DONE]" not in out


def test_relay_sends_a_stream_read_in_one_piece_as_one_final_part() -> None:
    meter = StreamMeter(request={"messages": []}, want_usage=False)
    data = chunk("a") + chunk("b") + b"data: [DONE]\n\n"

    async def collect() -> list[tuple[bytes, bool]]:
        return [p async for p in relay(data, _pieces(b"", 1), meter, cost_of)]

    parts = asyncio.run(collect())
    assert len(parts) == 1 and parts[0][1] is True
    assert parts[0][0] == chunk("a") + chunk("b") + b"data: [DONE]\n\n"


def test_relay_reads_usage_after_null_usage_chunks_and_counts_nothing_itself() -> None:
    def with_null_usage(text: str) -> bytes:
        obj = {
            "id": "c1",
            "model": "m",
            "usage": None,
            "choices": [{"index": 0, "delta": {"content": text}}],
        }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    tail = b"data: " + orjson.dumps({"id": "c1", "choices": [], "usage": usage}) + b"\n\n"
    data = with_null_usage("x") + with_null_usage('say "usage"') + tail + b"data: [DONE]\n\n"
    out, meter = run_relay(data, 9, want_usage=True)
    assert meter.final_usage() == Usage(7, 2, True)
    assert orjson.loads(out.split(b"\n\n")[-3][6:])["usage"]["prompt_tokens"] == 7


def test_relay_replaces_an_upstream_error_event_and_ends_without_done() -> None:
    """The upstream's error text (which may name its internals) goes to the log, not the client:
    the client gets the error class and the request id, and no [DONE] after it."""
    error = b"data: " + orjson.dumps({"error": {"message": "overloaded at 10.0.0.7"}}) + b"\n\n"
    out, meter = run_relay(chunk("a") + error + b"data: [DONE]\n\n", 4096, want_usage=False)
    assert meter.error == "upstream_error" and b"10.0.0.7" in (meter.error_detail or "").encode()
    assert b"10.0.0.7" not in out and b"[DONE]" not in out
    last = orjson.loads(out.rsplit(b"data: ", 1)[-1])
    assert last["error"]["code"] == "upstream_error"


def _split_by_regex(buffer: bytes) -> tuple[list[bytes], bytes]:
    events = []
    while (m := EVENT_END.search(buffer)) is not None:
        events.append(buffer[: m.end()])
        buffer = buffer[m.end() :]
    return events, buffer


@given(st.lists(st.sampled_from([b"data: x", b"\n", b"\r\n", b": c", b"data: [DONE]"])))
def test_split_events_matches_the_sse_blank_line_rule(pieces: list[bytes]) -> None:
    buffer = b"".join(pieces)
    assert split_events(buffer) == _split_by_regex(buffer)


def test_trace_sink_rotates_by_size_and_writes_valid_records(tmp_path: Path) -> None:
    sink = TraceSink(tmp_path / "requests.jsonl", max_bytes=2048, backups=2)
    for i in range(100):
        sink.write({"id": f"r{i}", "time": 1.0 + i, "tier": "small", "status": 200})
    sink.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["requests.jsonl", "requests.jsonl.1", "requests.jsonl.2"]
    for f in files:
        assert f.stat().st_size <= 2048
        for line in f.read_text().splitlines():
            assert TraceRecord.model_validate_json(line).schema_version == 1
    newest = [orjson.loads(x)["id"] for x in files[0].read_text().splitlines()]
    assert newest[-1] == "r99"


def test_trace_sink_after_close_drops_quietly(tmp_path: Path) -> None:
    sink = TraceSink(tmp_path / "t.jsonl", max_bytes=4096, backups=1)
    sink.close()
    sink.write({"id": "late", "time": 0.0})
    assert not (tmp_path / "t.jsonl").exists()


def test_prompt_tokens_counted_for_chat_and_token_id_prompts() -> None:
    chat = {"messages": [{"role": "user", "content": "hello world"}]}
    assert count_prompt_tokens(chat) == count_tokens("hello world") + 4
    assert count_prompt_tokens({"prompt": [1, 2, 3, 4, 5]}) == 5


def test_error_body_is_openai_shaped() -> None:
    body = error_body(429, "rate_limited", "slow down")
    assert body == {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limited",
        }
    }
