"""Stopping background tasks: the one way every service of ours (pollers, probes, renewers, the
reloader, the shadow workers) ends the tasks it started. At the bottom so every package can
share it; it imports nothing of ours."""

from __future__ import annotations

import asyncio
from typing import Any


async def stop_tasks(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task (None: nothing to stop) and wait until it has ended. Its cancellation
    and any error it ended with are swallowed: a stopping service must not fail because one of
    its loops did; the loops log their own errors."""
    running = [t for t in tasks if t is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
