"""Relays an Anthropic Messages stream passed through to a tier that speaks Messages
(`apis: [chat, messages]`), event by event, metering it on the way (router/proxy/native_relay.py
holds what every such relay shares).

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

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from backends.base import Usage
from backends.usage import MALFORMED, messages_usage_json, read_messages_usage
from router.proxy.native_relay import NativeMeter, decoded, relay_native
from router.proxy.stream_relay import UPSTREAM_ERROR, broken_stream_message

HELD = ("message_delta", "message_stop")


@dataclass(slots=True)
class MessagesMeter(NativeMeter):
    held: dict[str, dict[str, Any]] = field(default_factory=dict)

    def _usage(self, usage: Any) -> None:
        # Anthropic splits the usage: the prompt counts in message_start, the cumulative output
        # (and sometimes prompt) counts in message_delta; the later field wins.
        if usage is None:
            return
        if not isinstance(usage, dict):
            self.fault = MALFORMED
            return
        reported = self.reported if isinstance(self.reported, dict) else {}
        self.reported = {**reported, **{k: v for k, v in usage.items() if v is not None}}

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
            self.relayed(delta.get("text", delta.get("partial_json")), data)


def messages_meter(request: dict[str, Any]) -> MessagesMeter:
    return MessagesMeter(request=request, read_usage=read_messages_usage)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def error_event(code: str, request_id: str) -> bytes:
    message = broken_stream_message(code, request_id)
    return _sse("error", {"type": "error", "error": {"type": "api_error", "message": message}})


def _forward(event: bytes, meter: MessagesMeter) -> bool:
    """Record one event; True to send it on now (False: held, dropped, or the end)."""
    if meter.done or meter.error:
        return False
    event_of = decoded(event, meter)
    if isinstance(event_of, bool):
        return event_of
    kind, obj, data = event_of
    if kind == "error":
        detail = orjson.dumps(obj.get("error"))[:1000].decode("utf-8", "replace")
        meter.fail(UPSTREAM_ERROR, f"error event: {detail}")
        return False
    meter.observe(kind, obj, data)
    if kind in HELD:
        meter.held[kind] = obj
        meter.done = kind == "message_stop"
        return False
    return True


def relay_messages(
    first: bytes,
    rest: AsyncIterator[bytes],
    meter: MessagesMeter,
    cost_of: Callable[[Usage], float],
) -> AsyncIterator[tuple[bytes, bool]]:
    """Yield (client bytes, is the last part), as stream_relay.relay does."""

    def ended(usage: Usage) -> bytes:
        delta = meter.held.get("message_delta") or {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        }
        charged = messages_usage_json(usage, cost_usd=round(cost_of(usage), 10))
        stop = meter.held.get("message_stop") or {"type": "message_stop"}
        return _sse("message_delta", {**delta, "usage": charged}) + _sse("message_stop", stop)

    return relay_native(
        first,
        rest,
        meter,
        lambda e: _forward(e, meter),
        ended,
        lambda code: error_event(code, meter.request_id),
    )
