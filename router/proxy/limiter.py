"""Each tier's in-flight limit (`tiers[].max_inflight`, `queue_timeout_s`)."""

from __future__ import annotations

import asyncio

from router.observability.metrics import RouterMetrics


class TierLimiter:
    """At most `max_inflight` upstream requests per tier; a new one waits at most
    `queue_timeout_s` for a slot, then the caller falls back (or answers 429)."""

    def __init__(
        self, tier: str, max_inflight: int, queue_timeout_s: float, metrics: RouterMetrics
    ) -> None:
        self._sem = asyncio.Semaphore(max_inflight)
        self._timeout = queue_timeout_s
        self._gauge = metrics.inflight.labels(tier)

    async def acquire(self) -> bool:
        if not self._sem.locked():
            await self._sem.acquire()  # a free slot: returns without suspending
        elif self._timeout <= 0:
            return False
        else:
            try:
                await asyncio.wait_for(self._sem.acquire(), self._timeout)
            except TimeoutError:
                return False
        self._gauge.inc()
        return True

    def release(self) -> None:
        self._gauge.dec()
        self._sem.release()
