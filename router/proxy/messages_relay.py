"""Relays an Anthropic Messages stream passed through to a tier that speaks Messages
(`apis: [chat, messages]`), event by event, metering it on the way: stream_relay.py's job for
the client's own API.

Every event is forwarded as it arrives except the two that end the answer: `message_delta`
(the stop reason and the final usage) and `message_stop` are held to the end, when the usage the
request is charged for is known, and `message_delta` then carries that usage (Anthropic's
shape, the router's `cost_usd` added). The usage is the upstream's (`message_start`'s prompt
counts, `message_delta`'s cumulative ones) when it is well-formed and plausible (the usage
guard), else the router's own count of the text relayed. A stream that breaks off (closed before
`message_stop`, an upstream failure, an `error` event) ends with an Anthropic `error` event naming
the error class and the request id, never upstream internals, and no `message_stop`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from backends.base import UpstreamClientError, UpstreamError, Usage
from backends.tokens import count_prompt_tokens, count_tokens
from backends.usage import MALFORMED, messages_usage_json, read_messages_usage
from router.proxy.stream_relay import (
    KEEP_CONTENT_BYTES,
    MAX_EVENT_BYTES,
    UPSTREAM_ERROR,
    UPSTREAM_TRUNCATED,
)

log = logging.getLogger(__name__)

EVENT_END = re.compile(rb"\r?\n\r?\n")
HELD = ("message_delta", "message_stop")
MAX_COUNT_CHARS = 16 * 1024 * 1024  # text kept for our own count of a stream without a bound


@dataclass(slots=True)
class MessagesMeter:
    """What the relay learns from a Messages stream (the StreamMeter interface the request
    path reads: model, contents, error, final_usage)."""

    request: dict[str, Any]  # the chat request it stands for: our own prompt count
    request_id: str = ""
    completion_bound: int | None = None
    guard: Callable[[Usage, Callable[[], Usage]], Usage] | None = None
    reported: dict[str, Any] = field(default_factory=dict)  # usage fields as the stream said
    fault: str | None = None
    model: str | None = None
    texts: list[str] = field(default_factory=list)  # text and tool input relayed: our count
    text_chars: int = 0
    counted: Usage | None = None
    contents: list[bytes] = field(default_factory=list)  # the first KEEP_CONTENT_BYTES
    kept_bytes: int = 0
    held: dict[str, dict[str, Any]] = field(default_factory=dict)
    done: bool = False
    error: str | None = None
    error_detail: str | None = None
    charged: Usage | None = None

    def fail(self, code: str, detail: str) -> None:
        if self.error is None:
            self.error, self.error_detail = code, detail
            log.warning("stream %s: %s: %s", self.request_id, code, detail)

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        if not isinstance(usage, dict):
            self.fault = MALFORMED
            return
        self.reported.update({k: v for k, v in usage.items() if v is not None})

    def observe(self, kind: str, obj: dict[str, Any], data: bytes) -> None:
        if kind == "message_start":
            message = obj.get("message") if isinstance(obj.get("message"), dict) else {}
            if isinstance(message.get("model"), str):
                self.model = message["model"]
            self._usage(message.get("usage"))
        elif kind == "message_delta":
            self._usage(obj.get("usage"))
        elif kind == "content_block_delta":
            delta = obj.get("delta") if isinstance(obj.get("delta"), dict) else {}
            text = delta.get("text", delta.get("partial_json"))
            if isinstance(text, str) and self.text_chars < self._count_limit():
                # Bounded memory whatever the stream's size: past the completion bound the
                # charge is capped anyway, and a token is at least one character.
                self.texts.append(text)
                self.text_chars += len(text)
            if self.kept_bytes < KEEP_CONTENT_BYTES:
                self.contents.append(data)
                self.kept_bytes += len(data)

    def _count_limit(self) -> int:
        bound = self.completion_bound
        return MAX_COUNT_CHARS if bound is None else min(MAX_COUNT_CHARS, 32 * bound + 1024)

    def own_count(self) -> Usage:
        if self.counted is None:
            prompt = count_prompt_tokens(self.request)
            self.counted = Usage(prompt, count_tokens("".join(self.texts)), False)
        return self.counted

    def final_usage(self) -> Usage:
        """The usage to charge: the reported one, else our own count, through the guard."""
        if self.charged is None:
            raw = read_messages_usage(self.reported) if self.reported else None
            if raw is None or raw.fault is not None or self.fault is not None:
                fault = self.fault or (raw.fault if raw is not None else None)
                raw = replace(self.own_count(), fault=fault)
            self.charged = self.guard(raw, self.own_count) if self.guard is not None else raw
        return self.charged


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _parse(event: bytes) -> tuple[str | None, bytes | None]:
    kind, data = None, []
    for line in event.splitlines():
        if line.startswith(b"event:"):
            kind = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            data.append(line[5:].lstrip())
    return kind, b"\n".join(data) if data else None


def error_event(code: str, request_id: str) -> bytes:
    what = (
        "the upstream ended the stream before it was complete"
        if code == UPSTREAM_TRUNCATED
        else "the upstream failed mid-stream"
    )
    message = f"{what}; the answer is incomplete (request {request_id})"
    return _sse("error", {"type": "error", "error": {"type": "api_error", "message": message}})


def _forward(event: bytes, meter: MessagesMeter) -> bool:
    """Record one event; True to send it on now (False: held, dropped, or the end)."""
    if meter.done or meter.error:
        return False
    kind, data = _parse(event)
    if data is None:
        return True  # a comment / keep-alive
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        meter.fault = MALFORMED  # a broken event: what it said (usage, text) is lost
        return False
    if not isinstance(obj, dict):
        return True
    kind = kind or (obj.get("type") if isinstance(obj.get("type"), str) else None)
    if kind == "error":
        detail = orjson.dumps(obj.get("error"))[:1000].decode("utf-8", "replace")
        meter.fail(UPSTREAM_ERROR, f"error event: {detail}")
        return False
    meter.observe(kind or "", obj, data)
    if kind in HELD:
        meter.held[kind] = obj
        meter.done = kind == "message_stop"
        return False
    return True


async def relay_messages(
    first: bytes,
    rest: AsyncIterator[bytes],
    meter: MessagesMeter,
    cost_of: Callable[[Usage], float],
) -> AsyncIterator[tuple[bytes, bool]]:
    """Yield (client bytes, is the last part), as stream_relay.relay does."""
    buffer = first
    try:
        while not (meter.done or meter.error):
            events = []
            while (m := EVENT_END.search(buffer)) is not None:
                events.append(buffer[: m.end()])
                buffer = buffer[m.end() :]
            out = [e for e in events if _forward(e, meter)]
            if meter.done or meter.error:
                if out:
                    yield b"".join(out), False
                break
            if len(buffer) > MAX_EVENT_BYTES:
                meter.fail(UPSTREAM_ERROR, f"an SSE event longer than {MAX_EVENT_BYTES} bytes")
                break
            if out:
                yield b"".join(out), False
            try:
                buffer += await anext(rest)
            except StopAsyncIteration:
                tail = [e for e in [buffer + b"\n\n"] if buffer.strip() and _forward(e, meter)]
                if tail:
                    yield b"".join(tail), False
                if not meter.done:
                    meter.fail(UPSTREAM_TRUNCATED, "the upstream closed the stream early")
                break
    except (UpstreamError, UpstreamClientError) as exc:
        meter.fail(UPSTREAM_ERROR, f"failed mid-stream: {exc}")
    usage = await asyncio.to_thread(meter.final_usage)  # our own count may take a while
    if meter.error or not meter.done:
        yield error_event(meter.error or UPSTREAM_TRUNCATED, meter.request_id), True
        return
    delta = meter.held.get("message_delta") or {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
    }
    delta = {**delta, "usage": messages_usage_json(usage, cost_usd=round(cost_of(usage), 10))}
    stop = meter.held.get("message_stop") or {"type": "message_stop"}
    yield _sse("message_delta", delta) + _sse("message_stop", stop), True
