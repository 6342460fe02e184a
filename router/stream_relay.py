"""Relays an upstream SSE stream to the client event by event, metering it on the way.

Each complete SSE event is forwarded as soon as it arrives, byte for byte, except two: the
upstream's usage-only chunk and ``[DONE]``. Those are held to the end so the relay can emit one
final usage chunk (the upstream's, or one we synthesise from our own token count when the
upstream sent none, as llama.cpp does) carrying ``cost_usd``, then ``[DONE]``. The usage chunk
goes to the client only when it asked with ``stream_options.include_usage``; we always ask the
upstream for it so that budgets are charged from reported usage where possible.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from backends.base import UpstreamClientError, UpstreamError, Usage
from backends.tokens import count_prompt_tokens, count_tokens

EVENT_END = re.compile(rb"\r?\n\r?\n")
DONE = b"[DONE]"


@dataclass(slots=True)
class StreamMeter:
    """What the relay learns from a stream: the model, the reported usage, errors.

    Content chunks are kept as raw bytes and parsed only when the upstream reported no usage
    (their text is then counted): upstreams that report usage, as vLLM and OpenAI do, cost one
    JSON parse per stream instead of one per token."""

    request: dict[str, Any]
    want_usage: bool
    usage: Usage | None = None  # as reported by the upstream
    counted: Usage | None = None  # our own count, when the upstream reported none
    usage_chunk: dict[str, Any] | None = None
    last_data: bytes | None = None  # the last forwarded JSON event, raw
    model: str | None = None
    contents: list[bytes] = field(default_factory=list)  # forwarded JSON events, raw
    done: bool = False
    error: str | None = None

    def observe(self, obj: dict[str, Any]) -> bool:
        """Record one parsed JSON event; True when it is a usage-only chunk (held back)."""
        if self.model is None and isinstance(obj.get("model"), str):
            self.model = obj["model"]
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            prompt = int(usage.get("prompt_tokens") or 0)
            self.usage = Usage(prompt, usage["completion_tokens"], True)
            if not obj.get("choices"):
                self.usage_chunk = obj
                return True
        return False

    def final_usage(self) -> Usage:
        """The reported usage, else our own count (made once: the relay and the charge both ask)."""
        if self.usage is not None:
            return self.usage
        if self.counted is None:
            completion = count_tokens("".join(_texts(self.contents)))
            self.counted = Usage(count_prompt_tokens(self.request), completion, False)
        return self.counted

    def usage_event(self, usage: Usage, cost_usd: float) -> bytes:
        base = self.usage_chunk or {
            k: v for k, v in _parsed(self.last_data).items() if k in ("id", "object", "created",
                                                                      "model")
        }
        payload = {
            **base,
            "choices": [],
            "usage": {
                **((self.usage_chunk or {}).get("usage") or {}),
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                "cost_usd": round(cost_usd, 10),
            },
        }
        return b"data: " + orjson.dumps(payload) + b"\n\n"


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events (each with its blank line), and the incomplete rest."""
    if b"\r" not in buffer:  # the usual case: one split in C instead of a regex per event
        parts = buffer.split(b"\n\n")
        rest = parts.pop()
        return [part + b"\n\n" for part in parts], rest
    events = []
    while (m := EVENT_END.search(buffer)) is not None:
        events.append(buffer[: m.end()])
        buffer = buffer[m.end() :]
    return events, buffer


def _parsed(data: bytes | None) -> dict[str, Any]:
    try:
        obj = orjson.loads(data) if data else None
    except orjson.JSONDecodeError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _texts(contents: list[bytes]) -> list[str]:
    """The generated text of chat (delta.content) or completions (text) chunks, in order."""
    texts: list[str] = []
    for data in contents:
        for choice in _parsed(data).get("choices") or ():
            if isinstance(choice, dict):
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if isinstance(text, str):
                    texts.append(text)
    return texts


def _data_of(event: bytes) -> bytes | None:
    if event.startswith(b"data: ") and event.count(b"\n") <= 2:  # one data line: the usual case
        return event[6:].rstrip(b"\r\n")
    lines = [ln[5:].lstrip() for ln in event.splitlines() if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def error_event(code: str, message: str) -> bytes:
    body = {"error": {"message": message, "type": "upstream_error", "code": code}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def relay(
    first: bytes,
    rest: AsyncIterator[bytes],
    meter: StreamMeter,
    cost_of: Callable[[Usage], float],
) -> AsyncIterator[tuple[bytes, bool]]:
    """Yield (client bytes, is the last part). Ends after [DONE]; an upstream failure mid-stream
    becomes an SSE error event (headers are long gone, so no status can change) and sets
    meter.error.

    The end of the stream (the rest of the events, the usage chunk, ``[DONE]``) goes out as one
    part flagged last, so the response can end in the same socket write: every write wakes the
    client, and an upstream that answers fast usually sends the whole stream in one read."""
    buffer = first
    try:
        while True:
            events, buffer = split_events(buffer)
            out = [event for event in events if _forward(event, meter)]
            if meter.done:
                break
            if out:
                yield b"".join(out), False
            try:
                buffer += await anext(rest)
            except StopAsyncIteration:
                out = []
                break
    except (UpstreamError, UpstreamClientError) as exc:
        meter.error = "upstream_error"
        yield error_event("upstream_error", f"upstream failed mid-stream: {exc}"), True
        return
    usage = meter.final_usage()
    if meter.want_usage:
        out.append(meter.usage_event(usage, cost_of(usage)))
    out.append(b"data: [DONE]\n\n")
    yield b"".join(out), True


def _forward(event: bytes, meter: StreamMeter) -> bool:
    data = _data_of(event)
    if data is None:
        return True  # comments / keep-alives pass through
    if data == DONE:
        meter.done = True
        return False
    if meter.model is not None and not _worth_parsing(data):
        meter.contents.append(data)  # a content chunk: parsed later only if usage never comes
        meter.last_data = data
        return True
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return True
    if not isinstance(obj, dict):
        return True
    if "error" in obj:
        meter.error = "upstream_error"
        return True
    if meter.observe(obj):
        return False
    meter.contents.append(data)
    meter.last_data = data
    return True


def _worth_parsing(data: bytes) -> bool:
    """Might this event carry usage or an error? (A quote inside generated text is escaped, so
    the keys are only found where they are keys; a false positive only costs a parse.)"""
    if b'"error"' in data:
        return True
    return b'"usage"' in data and b'"usage":null' not in data and b'"usage": null' not in data
