"""Stopping background tasks: the one way every service of ours (pollers, probes, renewers, the
reloader, the shadow workers) ends the tasks it started. At the bottom so every package can
share it; it imports nothing of ours."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def stop_tasks(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task (None: nothing to stop) and wait until it has ended. Its cancellation
    and any error it ended with are swallowed: a stopping service must not fail because one of
    its loops did. The loops log their own errors; one that escaped them is logged here, since
    nothing else will ever see it."""
    running = [t for t in tasks if t is not None]
    for task in running:
        task.cancel()
    ended = await asyncio.gather(*running, return_exceptions=True)
    for task, result in zip(running, ended, strict=True):
        if isinstance(result, Exception):
            log.error("task %s had failed before it was stopped", task.get_name(), exc_info=result)
