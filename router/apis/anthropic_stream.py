"""A chat completions stream, as the relay sends it, turned into Anthropic Messages events.

Hand-written rather than litellm's `AnthropicStreamWrapper`: that wrapper consumes litellm's own
`ModelResponseStream` objects (built per chunk by its CustomStreamWrapper), not the relay's SSE
bytes, so using it would mean re-hydrating every chunk into litellm's pydantic models on the
request path; the event grammar itself is small (docs/agents.md, "What is translated").

Incremental: each part the relay yields becomes the events it carries, in one part, at once
(nothing is held but an unfinished SSE event). The relay's stream always ends with its usage
chunk (the usage the request is charged for, `cost_usd` included) then `[DONE]`, or with an
error event when the upstream broke off; here that becomes

    message_start, (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta {stop_reason, usage}, message_stop

or, for a stream that broke off, an `error` event after the blocks sent so far (no
message_stop: an Anthropic client raises rather than take a cut answer as complete).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import orjson

from backends.usage import ESTIMATED_FIELD

EVENT_END = re.compile(rb"\r?\n\r?\n")
DONE = b"[DONE]"

# OpenAI finish_reason -> Anthropic stop_reason (litellm's mapping).
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


# Where OpenAI-compatible servers put a reasoning model's thinking (vLLM's reasoning parsers:
# `reasoning_content`, newer ones `reasoning`): an Anthropic thinking block.
REASONING_FIELDS = ("reasoning_content", "reasoning")


def reasoning_of(message: dict[str, Any]) -> str | None:
    for name in REASONING_FIELDS:
        text = message.get(name)
        if isinstance(text, str) and text:
            return text
    return None


def stop_reason(finish_reason: Any) -> str:
    if not isinstance(finish_reason, str):
        return "end_turn"
    return STOP_REASONS.get(finish_reason, "end_turn")


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _events(buffer: bytes) -> tuple[list[bytes], bytes]:
    events = []
    while (m := EVENT_END.search(buffer)) is not None:
        events.append(buffer[: m.start()])
        buffer = buffer[m.end() :]
    return events, buffer


def _data(event: bytes) -> bytes | None:
    lines = [ln[5:].lstrip() for ln in event.splitlines() if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def anthropic_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """The relay's usage chunk (OpenAI's shape, what the request is charged for) in Anthropic's:
    the prompt split into fresh input, cache reads and cache writes."""
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    prompt = usage.get("prompt_tokens") or 0
    cached = details.get("cached_tokens") or 0
    written = details.get("cache_write_tokens") or 0
    out: dict[str, Any] = {
        "input_tokens": max(0, prompt - cached - written),
        "output_tokens": usage.get("completion_tokens") or 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": written,
    }
    if "cost_usd" in usage:
        out["cost_usd"] = usage["cost_usd"]
    if usage.get(ESTIMATED_FIELD):
        out[ESTIMATED_FIELD] = True
    return out


class MessagesStream:
    """The translation's state: which content block is open, and how the answer ended."""

    def __init__(self, message_id: str, tool_names: dict[str, str] | None = None) -> None:
        self.message_id = message_id
        self.tool_names = tool_names or {}  # litellm's truncated tool name -> the client's
        self.started = False
        self.index = -1  # the open content block's index (-1: none yet)
        self.open: str | None = None  # "text" | "thinking" | "tool_use" | None
        self.tool_index: int | None = None  # the chat tool call the open tool_use block is
        self.finish: Any = None
        self.usage: dict[str, Any] | None = None
        self.ended = False
        self.buffer = b""

    def _start(self, model: Any) -> list[bytes]:
        self.started = True
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": model if isinstance(model, str) else "",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # Known only at the end (llama.cpp reports none; the router counts): message_delta
            # carries the cumulative counts, which the SDKs take over these.
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [sse("message_start", {"type": "message_start", "message": message})]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open, self.tool_index = None, None
        return [sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _begin(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open = block["type"]
        out.append(
            sse(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def _chunk(self, obj: dict[str, Any]) -> list[bytes]:
        out = [] if self.started else self._start(obj.get("model"))
        if isinstance(obj.get("usage"), dict) and not obj.get("choices"):
            self.usage = obj["usage"]  # the relay's usage chunk: what is charged
            return out
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            thinking = reasoning_of(delta)
            if thinking is not None:
                if self.open != "thinking":
                    out += self._begin({"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta", "thinking": thinking}))
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.open != "text":
                    out += self._begin({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": text}))
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out += self._tool_call(call)
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]
        return out

    def _tool_call(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        index = call.get("index", 0)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        if self.open != "tool_use" or index != self.tool_index:  # a new call: its own block
            name = function.get("name") if isinstance(function.get("name"), str) else ""
            block = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{self.message_id}_{self.index + 1}",
                "name": self.tool_names.get(name, name),
                "input": {},
            }
            out += self._begin(block)
            self.tool_index = index
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return out

    def _end(self) -> list[bytes]:
        out = [] if self.started else self._start(None)
        if self.index < 0:  # an empty answer still has its one (empty) text block
            out += self._begin({"type": "text", "text": ""})
        out += self._close()
        usage = anthropic_usage(self.usage or {})
        delta = {"stop_reason": stop_reason(self.finish), "stop_sequence": None}
        out.append(sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        self.ended = True
        return out

    def _error(self, error: Any) -> list[bytes]:
        message = error.get("message") if isinstance(error, dict) else None
        out = [] if self.started else self._start(None)
        out += self._close()
        body = {
            "type": "error",
            "error": {"type": "api_error", "message": message or "the upstream failed mid-stream"},
        }
        out.append(sse("error", body))
        self.ended = True
        return out

    def feed(self, data: bytes) -> list[bytes]:
        """The Anthropic events of the relay's bytes `data` (complete events; the rest is held)."""
        events, self.buffer = _events(self.buffer + data)
        out: list[bytes] = []
        for event in events:
            if self.ended:
                break
            payload = _data(event)
            if payload is None:
                continue  # a comment or keep-alive: the relay's own, nothing to say
            if payload == DONE:
                out += self._end()
                continue
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue  # the relay forwards only JSON it parsed; nothing else is content
            if not isinstance(obj, dict):
                continue
            if "error" in obj:
                out += self._error(obj["error"])
            else:
                out += self._chunk(obj)
        return out


async def translate(
    parts: AsyncIterator[tuple[bytes, bool]], stream: MessagesStream
) -> AsyncIterator[tuple[bytes, bool]]:
    """The relay's parts as Anthropic events, part for part (the last stays the last)."""
    try:
        async for data, last in parts:
            out = stream.feed(data + (b"\n\n" if last else b""))
            if last and not stream.ended:  # the relay always ends with [DONE] or an error
                out += stream._error(None)
            if out or last:
                yield b"".join(out), last
    finally:
        close = getattr(parts, "aclose", None)
        if close is not None:
            await close()  # the relay's cleanup (slot, upstream, settle) runs there
