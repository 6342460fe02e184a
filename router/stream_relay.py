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
    request: dict[str, Any]
    want_usage: bool
    usage: Usage | None = None  # as reported by the upstream
    usage_chunk: dict[str, Any] | None = None
    last_chunk: dict[str, Any] | None = None
    model: str | None = None
    texts: list[str] = field(default_factory=list)
    done: bool = False
    error: str | None = None

    def observe(self, obj: dict[str, Any]) -> bool:
        """Record one JSON event; True when it is a usage-only chunk (held back)."""
        if self.model is None and isinstance(obj.get("model"), str):
            self.model = obj["model"]
        choices = obj.get("choices")
        for choice in choices or ():
            if isinstance(choice, dict):
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if isinstance(text, str):
                    self.texts.append(text)
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            prompt = int(usage.get("prompt_tokens") or 0)
            self.usage = Usage(prompt, usage["completion_tokens"], True)
            if not choices:
                self.usage_chunk = obj
                return True
        self.last_chunk = obj
        return False

    def final_usage(self) -> Usage:
        if self.usage is not None:
            return self.usage
        return Usage(count_prompt_tokens(self.request), count_tokens("".join(self.texts)), False)

    def usage_event(self, usage: Usage, cost_usd: float) -> bytes:
        base = self.usage_chunk or {
            k: v for k, v in (self.last_chunk or {}).items() if k in ("id", "object", "created",
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


def _data_of(event: bytes) -> bytes | None:
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
) -> AsyncIterator[bytes]:
    """Yield client bytes. Ends normally after [DONE]; an upstream failure mid-stream becomes an
    SSE error event (headers are long gone, so no status can change) and sets meter.error."""
    buffer = first
    try:
        while True:
            out: list[bytes] = []
            while (m := EVENT_END.search(buffer)) is not None:
                event, buffer = buffer[: m.end()], buffer[m.end() :]
                if _forward(event, meter):
                    out.append(event)
            if out:
                yield b"".join(out)
            if meter.done:
                break
            try:
                buffer += await anext(rest)
            except StopAsyncIteration:
                break
    except (UpstreamError, UpstreamClientError) as exc:
        meter.error = "upstream_error"
        yield error_event("upstream_error", f"upstream failed mid-stream: {exc}")
        return
    usage = meter.final_usage()
    if meter.want_usage:
        yield meter.usage_event(usage, cost_of(usage))
    yield b"data: [DONE]\n\n"


def _forward(event: bytes, meter: StreamMeter) -> bool:
    data = _data_of(event)
    if data is None:
        return True  # comments / keep-alives pass through
    if data == DONE:
        meter.done = True
        return False
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return True
    if not isinstance(obj, dict):
        return True
    if "error" in obj:
        meter.error = "upstream_error"
        return True
    return not meter.observe(obj)
