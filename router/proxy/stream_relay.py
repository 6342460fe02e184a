"""Relays an upstream SSE stream to the client event by event, metering it on the way.

Each complete SSE event is forwarded as soon as it arrives, byte for byte, except three: the
upstream's usage-only chunk and ``[DONE]`` are held to the end so the relay can emit one final
usage chunk (the upstream's, or one we synthesise from our own token count when the upstream sent
none, as llama.cpp does) carrying ``cost_usd``, then ``[DONE]``; an upstream error event is
replaced by our own. The usage chunk goes to the client only when it asked with
``stream_options.include_usage``; we always ask the upstream for it so that budgets are charged
from reported usage where possible.

A stream ends with ``[DONE]`` only when the upstream sent one. One that breaks off (the upstream
closed it early, failed, or sent an error event) ends with an OpenAI-style error event instead,
so a truncated answer never looks complete; that event names the error class and the request id,
never upstream internals (those go to the log and the trace).

Our own token count (when the upstream reports no usage) is incremental: content events are held
only until ``COUNT_BATCH_BYTES`` have arrived, then counted in a worker thread, so memory stays
bounded and the event loop free whatever the stream's size; counting stops once the count passes
the request's completion bound (the charge is capped there anyway).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from backends.base import UpstreamClientError, UpstreamError, Usage
from backends.tokens import count_prompt_tokens, count_tokens
from backends.usage import MALFORMED, read_usage, usage_json
from trace_format.request_text import stream_texts

log = logging.getLogger(__name__)

EVENT_END = re.compile(rb"\r?\n\r?\n")
DONE = b"[DONE]"
# Content held before it is counted: one batch takes ~10 ms of tiktoken, in a worker thread.
COUNT_BATCH_BYTES = 256 * 1024
# Content events kept for whoever reads the answer after the stream (shadow comparisons): the
# first this many bytes, a whole answer for any real one, and bounded for a runaway stream.
KEEP_CONTENT_BYTES = 1024 * 1024
# An SSE event (one chunk of an answer) is a few hundred bytes; one past this is a broken
# upstream, and holding it would let a single event take the proxy's memory.
MAX_EVENT_BYTES = 8 * 1024 * 1024

UPSTREAM_ERROR = "upstream_error"
UPSTREAM_TRUNCATED = "upstream_truncated"


@dataclass(slots=True)
class StreamMeter:
    """What the relay learns from a stream: the model, the reported usage, errors.

    Content chunks are kept as raw bytes and parsed only when they are counted, in batches:
    upstreams that report usage, as vLLM and OpenAI do, cost one JSON parse per stream instead of
    one per token (a stream shorter than a batch is never parsed when usage arrives)."""

    request: dict[str, Any]
    want_usage: bool
    request_id: str = ""
    completion_bound: int | None = None  # counting stops past it (the charge is capped there)
    # What the request path charges for the usage the stream ends with (its bound checks).
    guard: Callable[[Usage, Callable[[], Usage]], Usage] | None = None
    usage: Usage | None = None  # as reported by the upstream, well-formed
    fault: str | None = None  # the upstream reported usage that is no count (backends/usage.py)
    counted: Usage | None = None  # our own count, when the upstream reported none
    charged: Usage | None = None  # final_usage(), made once: the relay and the charge both ask
    usage_chunk: dict[str, Any] | None = None
    last_data: bytes | None = None  # the last forwarded JSON event, raw
    model: str | None = None
    pending: list[bytes] = field(default_factory=list)  # forwarded JSON events not yet counted
    pending_bytes: int = 0
    contents: list[bytes] = field(default_factory=list)  # the first KEEP_CONTENT_BYTES of them
    kept_bytes: int = 0
    completion_count: int = 0  # tokens of the content events counted so far
    done: bool = False
    error: str | None = None  # UPSTREAM_ERROR | UPSTREAM_TRUNCATED
    error_detail: str | None = None  # for the log and the trace, never the client

    def observe(self, obj: dict[str, Any]) -> bool:
        """Record one parsed JSON event; True when it is a usage-only chunk (held back)."""
        if self.model is None and isinstance(obj.get("model"), str):
            self.model = obj["model"]
        usage = read_usage(obj.get("usage"), obj.get("timings"))
        if usage is None:
            return False
        if usage.fault is not None:
            self.fault = usage.fault
        else:
            self.usage = usage
        if not obj.get("choices"):
            # A broken usage chunk never reaches the client: it gets our usage chunk instead.
            self.usage_chunk = obj if usage.fault is None else None
            return True
        return False

    def add_content(self, data: bytes) -> None:
        self.last_data = data
        if self.kept_bytes < KEEP_CONTENT_BYTES:
            self.contents.append(data)
            self.kept_bytes += len(data)
        if self._counting():
            self.pending.append(data)
            self.pending_bytes += len(data)

    def _counting(self) -> bool:
        # Counted even when usage may come (it comes last, and may then be implausible).
        return self.completion_bound is None or self.completion_count <= self.completion_bound

    def _take_pending(self) -> list[bytes]:
        batch, self.pending, self.pending_bytes = self.pending, [], 0
        return batch if self._counting() else []

    async def count_pending(self) -> None:
        """Count the held content in a worker thread (the event loop keeps serving)."""
        batch = self._take_pending()
        if batch:
            self.completion_count += await asyncio.to_thread(_count_events, batch)

    async def finish_count(self) -> None:
        """At the end of the stream: our own count, if it is needed, made off the event loop."""
        if self.counted is not None or (self.usage is not None and self.fault is None):
            return
        await self.count_pending()
        prompt = await asyncio.to_thread(count_prompt_tokens, self.request)
        self.counted = Usage(prompt, self.completion_count, False, self.fault)

    def own_count(self) -> Usage:
        if self.counted is None:  # the stream was cut short (client gone): count what is left
            batch = self._take_pending()
            completion = self.completion_count + (_count_events(batch) if batch else 0)
            self.counted = Usage(count_prompt_tokens(self.request), completion, False, self.fault)
        return self.counted

    def final_usage(self) -> Usage:
        """The usage to charge: the reported one, else our own count, through the guard."""
        if self.charged is None:
            raw = self.usage if self.usage is not None and self.fault is None else self.own_count()
            self.charged = self.guard(raw, self.own_count) if self.guard is not None else raw
        return self.charged

    def fail(self, code: str, detail: str) -> None:
        if self.error is None:
            self.error, self.error_detail = code, detail
            log.warning("stream %s: %s: %s", self.request_id, code, detail)

    def usage_event(self, usage: Usage, cost_usd: float) -> bytes:
        base = self.usage_chunk or {
            k: v
            for k, v in _parsed(self.last_data).items()
            if k in ("id", "object", "created", "model")
        }
        # The upstream's own usage fields (token details) only with its counts, not our estimate.
        reported = (self.usage_chunk or {}).get("usage") if usage.reported else None
        ours = usage_json(usage, cost_usd=round(cost_usd, 10))
        out = {**(reported or {}), **ours}
        for key in ("prompt_tokens_details", "completion_tokens_details"):
            # The upstream's other details (audio tokens, ...) stay beside the priced ones.
            theirs = (reported or {}).get(key)
            if key in ours and isinstance(theirs, dict):
                out[key] = {**theirs, **ours[key]}
        payload = {**base, "choices": [], "usage": out}
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


def _count_events(contents: list[bytes]) -> int:
    return count_tokens("".join(stream_texts(contents)))


def _data_of(event: bytes) -> bytes | None:
    if event.startswith(b"data: ") and event.count(b"\n") <= 2:  # one data line: the usual case
        return event[6:].rstrip(b"\r\n")
    lines = [ln[5:].lstrip() for ln in event.splitlines() if ln.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def broken_stream_message(code: str, request_id: str) -> str:
    """What the client is told of a stream that broke off, in every API's error event: the error
    class and the request id only, never the upstream's internals."""
    what = (
        "the upstream ended the stream before it was complete"
        if code == UPSTREAM_TRUNCATED
        else "the upstream failed mid-stream"
    )
    return f"{what}; the answer is incomplete (request {request_id})"


def error_event(code: str, request_id: str) -> bytes:
    """The client's view of a stream that broke off: the error class and the request id only."""
    message = broken_stream_message(code, request_id)
    body = {"error": {"message": message, "type": "upstream_error", "param": None, "code": code}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def relay(
    first: bytes,
    rest: AsyncIterator[bytes],
    meter: StreamMeter,
    cost_of: Callable[[Usage], float],
) -> AsyncIterator[tuple[bytes, bool]]:
    """Yield (client bytes, is the last part). Ends after [DONE]; a stream that breaks off
    (headers are long gone, so no status can change) ends with an error event and sets
    meter.error.

    The end of the stream (the rest of the events, the usage chunk, ``[DONE]``) goes out as one
    part flagged last, so the response can end in the same socket write: every write wakes the
    client, and an upstream that answers fast usually sends the whole stream in one read."""
    buffer = first
    out: list[bytes] = []
    try:
        while True:
            events, buffer = split_events(buffer)
            out = [event for event in events if _forward(event, meter)]
            if meter.done or meter.error:
                break
            if len(buffer) > MAX_EVENT_BYTES:
                meter.fail(UPSTREAM_ERROR, f"an SSE event longer than {MAX_EVENT_BYTES} bytes")
                break
            if meter.pending_bytes >= COUNT_BATCH_BYTES:
                await meter.count_pending()
            if out:
                yield b"".join(out), False
            out = []
            try:
                buffer += await anext(rest)
            except StopAsyncIteration:
                # The last event may lack its blank line; anything else means the answer was cut.
                out = [e for e in split_events(buffer + b"\n\n")[0] if _forward(e, meter)]
                if not meter.done:
                    meter.fail(UPSTREAM_TRUNCATED, "the upstream closed the stream without [DONE]")
                break
    except (UpstreamError, UpstreamClientError) as exc:
        meter.fail(UPSTREAM_ERROR, f"failed mid-stream: {exc}")
    await meter.finish_count()
    usage = meter.final_usage()
    if meter.want_usage:
        out.append(meter.usage_event(usage, cost_of(usage)))
    out.append(error_event(meter.error, meter.request_id) if meter.error else b"data: [DONE]\n\n")
    yield b"".join(out), True


def _forward(event: bytes, meter: StreamMeter) -> bool:
    if meter.done or meter.error:
        return False  # nothing after [DONE] or an error reaches the client
    data = _data_of(event)
    if data is None:
        return True  # comments / keep-alives pass through
    if data == DONE:
        meter.done = True
        return False
    if meter.model is not None and not _worth_parsing(data):
        meter.add_content(data)  # a content chunk: parsed later only if usage never comes
        return True
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        # A broken event (the usage chunk, cut, in practice): no client could parse it, and
        # whatever usage it carried is lost, so the charge comes from our own count.
        meter.fault = MALFORMED
        return False
    if not isinstance(obj, dict):
        return True
    if "error" in obj:
        detail = orjson.dumps(obj["error"])[:1000].decode("utf-8", "replace")
        meter.fail(UPSTREAM_ERROR, f"error event: {detail}")
        return False
    if meter.observe(obj):
        return False
    meter.add_content(data)
    return True


def _worth_parsing(data: bytes) -> bool:
    """Might this event carry usage or an error, or be broken? (A quote inside generated text is
    escaped, so the keys are only found where they are keys; a false positive only costs a
    parse.)"""
    if b'"error"' in data or not data.endswith(b"}"):
        return True
    return b'"usage"' in data and b'"usage":null' not in data and b'"usage": null' not in data
