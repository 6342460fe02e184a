"""Requests kept flowing through a live proxy while something changes under it (a promotion, a
rollback), and the moment a new model's score first shows in `x-router-score`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from tests.support.waiting import wait_for

Answer = tuple[int, str]  # (HTTP status, 0 for a failed call; x-router-score or the error)


@contextlib.contextmanager
def requests_flowing(ask: Callable[[], Answer], join_s: float = 120) -> Iterator[list[Answer]]:
    """A thread calls `ask` one request after another until the block ends; yields the answers
    so far (appended as they come). A call that raises is a failed request, recorded."""
    seen: list[Answer] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                seen.append(ask())
            except Exception as exc:  # any failure is a failed request, for the test to report
                seen.append((0, repr(exc)))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        yield seen
    finally:
        stop.set()
        worker.join(timeout=join_s)


def first_scored(seen: list[Answer], score: str, since: int, timeout_s: float, what: str) -> int:
    """Wait until a request after index `since` carries `score`; its index."""
    wait_for(lambda: any(s == score for _, s in seen[since:]), timeout_s, what)
    return next(i for i in range(since, len(seen)) if seen[i][1] == score)
