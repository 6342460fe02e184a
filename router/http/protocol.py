"""uvicorn's httptools protocol with the limits it lacks, passed to uvicorn as its `http` class.

uvicorn bounds a request head only under h11 (`h11_max_incomplete_event_size`); under httptools,
the stack we run for speed, a 1 MB header or 10,000 headers were accepted, and a head (or an
opened connection that sends nothing) could take forever. A body had no deadline either: 300
connections dripping a byte every 2 s stayed open as long as they liked. This subclass refuses a
head past
`server.max_header_bytes` or `server.max_headers` with 431, and a request whose head and body have
not fully arrived within `server.body_timeout_s` of its first byte with 408 (the app reading its
body sees a disconnect); it closes the connection either way.

HTTP/1.0 has no chunked encoding, yet uvicorn's httptools cycle frames every response without a
Content-Length as chunked (an HTTP/1.0 client then reads the chunk sizes as content). For
HTTP/1.0 requests the cycle below sends such a response close-delimited instead: no
Transfer-Encoding, the connection closed at its end (uvicorn never keeps a 1.0 connection).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from router.http.body_limits import BODY_TIMEOUT
from router.http.errors import error_body_for

REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _HeadRefused(Exception):
    """Raised inside a parser callback to stop parsing a refused head."""


class CloseDelimitedCycle(RequestResponseCycle):
    """An HTTP/1.0 request's cycle: a response without Content-Length ends with the connection."""

    close_delimited = False

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            headers = message.get("headers", [])
            if not any(name.lower() == b"content-length" for name, _ in headers):
                self.close_delimited = True
                self.chunked_encoding = False  # uvicorn adds chunked framing only while None
                self.expected_content_length = sys.maxsize
        elif (
            self.close_delimited
            and message["type"] == "http.response.body"
            and not message.get("more_body", False)
        ):
            # The last part: uvicorn checks the declared length ran out exactly here.
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes = 64 * 1024
    max_headers = 100
    request_timeout_s = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._incomplete = False  # a request has begun and not fully arrived
        self._in_head = False
        self._head_bytes = 0  # exact: request line and header fields seen so far
        self._raw_head_bytes = 0  # coarse: bytes of the reads that ended inside the head
        self._headers = 0
        self._url = b""  # this request's target, for the error shape of its path
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None

    # --- the request deadline: head and body within request_timeout_s -------------------------
    # Armed only when a read ends with a request incomplete (and once per connection, for one
    # that sends nothing), so the usual request, whole in one read, costs no timer at all.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(self.request_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self._refused or self.transport.is_closing():
            return
        if not self._incomplete:  # a connection that never asked anything: nothing to answer
            self._refused = True
            self.transport.close()
            return
        cycle = self.cycle
        if self._in_head or cycle is None:
            self._refuse(
                408,
                "request_timeout",
                f"the request did not arrive within {self.request_timeout_s:g} s",
            )
            return
        # In the body: the app is waiting for it. It sees a disconnect (and, by the mark, records
        # a 408); its own answer is dropped, as for any disconnected client.
        cycle.scope.setdefault("extensions", {})[BODY_TIMEOUT] = True
        if not cycle.response_started:
            self._refuse(
                408,
                "request_timeout",
                f"the request body did not arrive within {self.request_timeout_s:g} s",
            )
        else:
            self._refused = True
            self.transport.close()
        cycle.disconnected = True
        cycle.message_event.set()

    # --- head size -----------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self._refused or not self._incomplete:
            return
        if self._in_head:
            # A single huge header is buffered by the parser until it ends; stop it here. (Counts
            # the whole read: a pipelined request's head may be charged a previous body's tail.)
            self._raw_head_bytes += len(data)
            if self._raw_head_bytes > self.max_header_bytes:
                self._refuse(
                    431,
                    "request_header_fields_too_large",
                    f"request headers are larger than {self.max_header_bytes} bytes",
                )
                return
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._incomplete = self._in_head = True
        self._head_bytes = self._raw_head_bytes = self._headers = 0
        self._url = b""
        self._disarm()  # the connection's first deadline, or none: this request's starts now

    def on_url(self, url: bytes) -> None:
        if len(self._url) < 4096:  # the parser may give it in pieces
            self._url += url[: 4096 - len(self._url)]
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        if self._headers > self.max_headers:
            self._refuse(
                431,
                "request_header_fields_too_large",
                f"request has more than {self.max_headers} header fields",
            )
            raise _HeadRefused
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_header_bytes:
            self._refuse(
                431,
                "request_header_fields_too_large",
                f"request headers are larger than {self.max_header_bytes} bytes",
            )
            raise _HeadRefused

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()
        cycle = self.cycle
        if (
            cycle is not None
            and cycle.scope is self.scope
            and self.scope.get("http_version") == "1.0"
        ):
            # Before its task first runs, so every send goes through the 1.0 framing.
            cycle.__class__ = CloseDelimitedCycle

    def on_message_complete(self) -> None:
        self._incomplete = False
        self._disarm()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # a refused head was answered already; the parser just stopped
            super().send_400_response(msg)

    def _refuse(self, status: int, code: str, message: str) -> None:
        self._refused = True
        self._disarm()
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        body = orjson.dumps(error_body_for(path, status, code, message))
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n"
        ) % (status, REASONS[status], len(body))
        if not self.transport.is_closing():
            self.transport.write(head + body)
            self.transport.close()


def limited_protocol(
    max_header_bytes: int, max_headers: int, request_timeout_s: float
) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=` with this server's limits."""
    limits = {
        "max_header_bytes": max_header_bytes,
        "max_headers": max_headers,
        "request_timeout_s": request_timeout_s,
    }
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), limits)
