"""What every relay of a stream passed through in a client API's own shape shares (a tier that
speaks the API: `apis:`): the meter's accounting (the text relayed, for our own count; the
first KEEP_CONTENT_BYTES of it, for shadow comparisons; the charged usage through the usage
guard) and the loop that forwards each SSE event as it arrives until the API's end or an error.

What differs per API is which events carry the text and the usage, which end the stream, and
how the end is rewritten with the charged usage: router/proxy/messages_relay.py and
router/proxy/responses_relay.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from backends.base import UpstreamClientError, UpstreamError, Usage
from backends.tokens import count_prompt_tokens, count_tokens
from backends.usage import MALFORMED
from router.proxy.stream_relay import (
    KEEP_CONTENT_BYTES,
    MAX_EVENT_BYTES,
    UPSTREAM_ERROR,
    UPSTREAM_TRUNCATED,
    split_events,
)

log = logging.getLogger(__name__)

MAX_COUNT_CHARS = 16 * 1024 * 1024  # text kept for our own count of a stream without a bound


@dataclass(slots=True)
class NativeMeter:
    """The interface the request path reads of a meter (model, contents, error, error_detail,
    final_usage) and the accounting behind it; `read_usage` reads the API's usage object."""

    request: dict[str, Any]  # the chat request it stands for: our own prompt count
    read_usage: Callable[[Any], Usage | None]
    request_id: str = ""
    completion_bound: int | None = None
    guard: Callable[[Usage, Callable[[], Usage]], Usage] | None = None
    reported: Any = None  # the usage object as the stream said it
    fault: str | None = None
    model: str | None = None
    texts: list[str] = field(default_factory=list)  # text and tool input relayed: our count
    text_chars: int = 0
    counted: Usage | None = None
    contents: list[bytes] = field(default_factory=list)  # the first KEEP_CONTENT_BYTES
    kept_bytes: int = 0
    done: bool = False
    error: str | None = None
    error_detail: str | None = None
    charged: Usage | None = None

    def fail(self, code: str, detail: str) -> None:
        if self.error is None:
            self.error, self.error_detail = code, detail
            log.warning("stream %s: %s: %s", self.request_id, code, detail)

    def relayed(self, text: Any, data: bytes) -> None:
        """A content event: its text counts (bounded memory whatever the stream's size: past
        the completion bound the charge is capped anyway, and a token is at least one
        character), its bytes are kept up to KEEP_CONTENT_BYTES."""
        if isinstance(text, str) and self.text_chars < self._count_limit():
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
            raw = self.read_usage(self.reported) if self.reported is not None else None
            if raw is None or raw.fault is not None or self.fault is not None:
                fault = self.fault or (raw.fault if raw is not None else None)
                raw = replace(self.own_count(), fault=fault)
            self.charged = self.guard(raw, self.own_count) if self.guard is not None else raw
        return self.charged


def parse_event(event: bytes) -> tuple[str | None, bytes | None]:
    """An SSE event's `event:` name and its data (None: a comment or keep-alive)."""
    kind, data = None, []
    for line in event.splitlines():
        if line.startswith(b"event:"):
            kind = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            data.append(line[5:].lstrip())
    return kind, b"\n".join(data) if data else None


def decoded(event: bytes, meter: NativeMeter) -> tuple[str, dict[str, Any], bytes] | bool:
    """(its name, its object, its data) of a JSON event; else True: send it on as it is (a
    comment, a keep-alive, JSON that is no object), or False: drop it (not JSON, so what it said,
    usage or text, is lost: the meter's fault)."""
    kind, data = parse_event(event)
    if data is None:
        return True
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        meter.fault = MALFORMED
        return False
    if not isinstance(obj, dict):
        return True
    if kind is None and isinstance(obj.get("type"), str):
        kind = obj["type"]
    return kind or "", obj, data


async def forwarded(
    first: bytes,
    rest: AsyncIterator[bytes],
    meter: NativeMeter,
    forward: Callable[[bytes], bool],
) -> AsyncIterator[bytes]:
    """The events to send on, as they arrive, until `meter.done` (the API's end, held by
    `forward`) or an error; a stream that closes before its end fails the meter (truncated)."""
    buffer = first
    try:
        while True:
            events, buffer = split_events(buffer)
            out = [e for e in events if forward(e)]
            if out:
                yield b"".join(out)
            if meter.done or meter.error:
                return
            if len(buffer) > MAX_EVENT_BYTES:
                meter.fail(UPSTREAM_ERROR, f"an SSE event longer than {MAX_EVENT_BYTES} bytes")
                return
            try:
                buffer += await anext(rest)
            except StopAsyncIteration:
                tail = [e for e in split_events(buffer + b"\n\n")[0] if forward(e)]
                if tail:
                    yield b"".join(tail)
                if not meter.done:
                    meter.fail(UPSTREAM_TRUNCATED, "the upstream closed the stream early")
                return
    except (UpstreamError, UpstreamClientError) as exc:
        meter.fail(UPSTREAM_ERROR, f"failed mid-stream: {exc}")


def relay_native(
    first: bytes,
    rest: AsyncIterator[bytes],
    meter: NativeMeter,
    forward: Callable[[bytes], bool],
    ended: Callable[[Usage], bytes],
    failed: Callable[[str], bytes],
) -> AsyncIterator[tuple[bytes, bool]]:
    """Yield (client bytes, is the last part), as stream_relay.relay does: the events `forward`
    sends on, as they arrive; then the API's end carrying the charged usage (`ended`), or, for a
    stream that broke off, the API's error event (`failed`, given the error code)."""

    async def parts() -> AsyncIterator[tuple[bytes, bool]]:
        async for part in forwarded(first, rest, meter, forward):
            yield part, False
        usage = await asyncio.to_thread(meter.final_usage)  # our own count may take a while
        if meter.error or not meter.done:
            yield failed(meter.error or UPSTREAM_TRUNCATED), True
            return
        yield ended(usage), True

    return parts()
