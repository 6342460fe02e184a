"""Client-disconnect handling: a disconnect cancels the upstream work, streaming or not.

Starlette notices a gone client only when a write fails, which for a slow upstream can be much
later (or never, for a non-streaming answer). Both helpers here race the work against the ASGI
``http.disconnect`` message instead, and cancel the work the moment it arrives; cancellation
unwinds into the backend, which closes its upstream connection, which stops the upstream's
generation (llama.cpp and vLLM both abort a request whose connection closes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(
    request: Request, work: Awaitable[T], gone: type[Exception]
) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise `gone`.

    One watcher task per request whose completion cancels the waiting task: cheaper than
    running `work` as a second task and waiting on both."""
    waiter = asyncio.current_task()
    assert waiter is not None
    waiting = [True]  # once `work` is over, a late disconnect must not cancel the caller

    def on_disconnect(w: asyncio.Future[None]) -> None:
        if waiting[0] and not w.cancelled():
            waiter.cancel()

    watch = asyncio.ensure_future(_disconnected(request.receive))
    watch.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if watch.done() and not watch.cancelled():
            raise gone() from None
        raise
    finally:
        waiting[0] = False
        watch.cancel()


class RelayResponse(Response):
    """An SSE response that stops its body iterator as soon as the client disconnects."""

    media_type = "text/event-stream"

    def __init__(self, parts: AsyncIterator[bytes], headers: Mapping[str, str]) -> None:
        self.parts = parts
        self.status_code = 200
        self.background = None
        self.init_headers({**headers, "cache-control": "no-cache", "x-accel-buffering": "no"})

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for part in self.parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not pump.done():
                pump.cancel()  # unwinds into the body iterator, closing the upstream
            with contextlib.suppress(BaseException):
                await pump
            await _aclose(self.parts)


async def _aclose(parts: Any) -> None:
    close = getattr(parts, "aclose", None)
    if close is not None:
        with contextlib.suppress(BaseException):
            await close()
