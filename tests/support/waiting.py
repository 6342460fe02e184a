"""Waiting on a condition, not on a clock: tests poll what they wait for, with a deadline that
only bounds a hang (a fast machine never sleeps longer than one poll)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.02
) -> None:
    """Return as soon as `condition()` is truthy; fail the test naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
