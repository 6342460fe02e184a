"""Client-disconnect handling: a disconnect cancels the upstream work, streaming or not.

Starlette notices a gone client only when a write fails, which for a slow upstream can be much
later (or never, for a non-streaming answer). Here a small watcher task waits for the ASGI
``http.disconnect`` message and cancels the request's own task the moment it arrives;
cancellation unwinds into the backend, which closes its upstream connection, which stops the
upstream's generation (llama.cpp and vLLM both abort a request whose connection closes).
Cancelling the request task itself (rather than running the work as a second task and waiting
on both) costs one task per request instead of two.
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


class DisconnectWatch:
    """Cancels the current task if the client disconnects before close()."""

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._active = True
        self._watch = asyncio.ensure_future(_disconnected(receive))
        self._watch.add_done_callback(self._fire)

    def _fire(self, watch: asyncio.Future[None]) -> None:
        # After close() the work is over: a late disconnect must not cancel the caller.
        if self._active and not watch.cancelled() and watch.exception() is None:
            self._task.cancel()

    @property
    def fired(self) -> bool:
        w = self._watch
        return w.done() and not w.cancelled() and w.exception() is None

    def absorb(self) -> None:
        """The cancellation was ours (client gone): let the task carry on with its cleanup."""
        self._task.uncancel()

    def close(self) -> None:
        self._active = False
        self._watch.cancel()

    async def guard(self, work: Awaitable[T], gone: type[Exception]) -> T:
        """Await `work`; if the client disconnects first, cancel it and raise `gone`."""
        try:
            return await work
        except asyncio.CancelledError:
            if not self.fired:
                raise  # a real cancellation (shutdown): not ours to absorb
            self.absorb()
            raise gone() from None


async def until_disconnect(request: Request, work: Awaitable[T], gone: type[Exception]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise `gone`."""
    watch = DisconnectWatch(request.receive)
    try:
        return await watch.guard(work, gone)
    finally:
        watch.close()


class RelayResponse(Response):
    """An SSE response that stops its body iterator as soon as the client disconnects.

    `parts` yields (bytes, is the last part): the last one ends the response in the same write.
    `watch` is the request's disconnect watch when the caller already has one running (it
    waited for the upstream's first bytes under it); the response takes it over and closes it."""

    media_type = "text/event-stream"

    def __init__(
        self,
        parts: AsyncIterator[tuple[bytes, bool]],
        headers: Mapping[str, str],
        watch: DisconnectWatch | None = None,
    ) -> None:
        self.parts = parts
        self.watch = watch
        self.status_code = 200
        self.background = None
        self.init_headers({**headers, "cache-control": "no-cache", "x-accel-buffering": "no"})

    async def _pump(self, send: Send) -> None:
        # The first part is taken before anything is written: a generator that never started
        # skips its `finally` when closed, and there the request's cleanup (tier slot, upstream
        # connection, budget settle) lives; a failed or cancelled first write must not skip it.
        parts = aiter(self.parts)
        first = await anext(parts, None)
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        more = True
        if first is not None:
            more = not first[1]
            await send({"type": "http.response.body", "body": first[0], "more_body": more})
        if more:
            async for part, last in parts:
                more = not last
                await send({"type": "http.response.body", "body": part, "more_body": more})
        if more:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = self.watch or DisconnectWatch(receive)
        try:
            await self._pump(send)  # a disconnect cancels it, unwinding into the upstream
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            watch.absorb()
        except OSError:
            pass  # the client went away during a write
        finally:
            watch.close()
            await _aclose(self.parts)


async def _aclose(parts: Any) -> None:
    close = getattr(parts, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()
