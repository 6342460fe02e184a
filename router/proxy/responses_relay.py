"""Relays an OpenAI Responses stream passed through to a tier that speaks Responses
(`apis: [chat, responses]`), event by event, metering it on the way (router/proxy/native_relay.py
holds what every such relay shares).

Every event is forwarded as it arrives except the one that ends the answer,
`response.completed` (or `response.incomplete`): it is held to the end, when the usage the
request is charged for is known, and then carries that usage (`input_tokens`,
`input_tokens_details.cached_tokens`, ..., the router's `cost_usd`). The usage is the upstream's
(`response.usage` of that last event) when it is well-formed and plausible (the usage guard),
else the router's own count of the text relayed. A stream that breaks off (closed before its last
event, an upstream failure, an `error` or `response.failed` event, a last event that is not
JSON) ends with an `error` event naming the error class and the request id, never upstream
internals, and no `response.completed`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from backends.base import Usage
from backends.usage import MALFORMED, read_responses_usage
from router.apis.responses import usage_object
from router.proxy.native_relay import NativeMeter, decoded, relay_native
from router.proxy.stream_relay import UPSTREAM_ERROR, broken_stream_message

LAST = ("response.completed", "response.incomplete")
FAILED = ("error", "response.failed")
DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta")


@dataclass(slots=True)
class ResponsesMeter(NativeMeter):
    last: dict[str, Any] | None = None  # the held response.completed / .incomplete
    sequence: int = 0  # the next sequence_number (for our own error event)

    def observe(self, kind: str, obj: dict[str, Any], data: bytes) -> None:
        if isinstance(obj.get("sequence_number"), int):
            self.sequence = obj["sequence_number"] + 1
        response = obj.get("response")
        if isinstance(response, dict) and isinstance(response.get("model"), str):
            self.model = response["model"]
        if kind in DELTAS:
            self.relayed(obj.get("delta"), data)
        elif kind in LAST:
            self.last, self.done = obj, True
            self.reported = response.get("usage") if isinstance(response, dict) else MALFORMED


def responses_meter(request: dict[str, Any]) -> ResponsesMeter:
    return ResponsesMeter(request=request, read_usage=read_responses_usage)


def _sse(data: dict[str, Any]) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def error_event(code: str, meter: ResponsesMeter) -> bytes:
    """The client's view of a stream that broke off: the error class and the request id only
    (OpenAI's `error` event; the stream ends there, with no response.completed)."""
    message = broken_stream_message(code, meter.request_id)
    event = {"type": "error", "code": code, "message": message, "param": None}
    return _sse({**event, "sequence_number": meter.sequence})


def _forward(event: bytes, meter: ResponsesMeter) -> bool:
    """Record one event; True to send it on now (False: held, dropped, or the end)."""
    if meter.done or meter.error:
        return False
    event_of = decoded(event, meter)
    if isinstance(event_of, bool):
        return event_of
    kind, obj, data = event_of
    if kind in FAILED:
        detail = orjson.dumps(obj.get("response", obj))[:1000].decode("utf-8", "replace")
        meter.fail(UPSTREAM_ERROR, f"{kind} event: {detail}")
        return False
    meter.observe(kind, obj, data)
    return not meter.done


def relay_responses(
    first: bytes,
    rest: AsyncIterator[bytes],
    meter: ResponsesMeter,
    cost_of: Callable[[Usage], float],
) -> AsyncIterator[tuple[bytes, bool]]:
    """Yield (client bytes, is the last part), as stream_relay.relay does."""

    def ended(usage: Usage) -> bytes:
        last = meter.last or {}  # set with `done`: relay_native calls this only then
        response = last.get("response") if isinstance(last.get("response"), dict) else {}
        charged = usage_object(usage, cost_of(usage))
        return _sse({**last, "response": {**response, "usage": charged}})

    return relay_native(
        first,
        rest,
        meter,
        lambda e: _forward(e, meter),
        ended,
        lambda code: error_event(code, meter),
    )
