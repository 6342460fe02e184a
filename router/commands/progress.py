"""Progress bars for long commands: a bar with the count, elapsed time and an ETA on stderr
(drawn only on a terminal; piped output stays clean)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def _bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    return f"{minutes}:{secs:02d}"


class _Lines:
    """Progress as plain lines on stderr, for when no bar can be drawn (piped, CI, a log): each
    phase's start, the time the one before it took, the time so far and, once a `timed` phase
    (a model fit) has finished, what the `timed_total` of them still to finish should take at
    that pace."""

    def __init__(
        self, console: Console, total: int, timed: Callable[[str], bool], timed_total: int
    ) -> None:
        self.console, self.total, self.timed, self.timed_total = console, total, timed, timed_total
        self.start = time.monotonic()
        self.phase_start = self.start
        self.current: str | None = None
        self.durations: list[float] = []  # of the finished timed phases
        self.index = 0

    def _print(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _finish_current(self, now: float) -> str:
        if self.current is None:
            return ""
        if self.timed(self.current):
            self.durations.append(now - self.phase_start)
        return f"; {self.current} took {_clock(now - self.phase_start)}"

    def begin(self, message: str) -> None:
        now = time.monotonic()
        took = self._finish_current(now)
        self.index += 1
        left = ""
        if self.durations and self.timed_total > len(self.durations):
            pace = sum(self.durations) / len(self.durations)
            left = f", about {_clock(pace * (self.timed_total - len(self.durations)))} left"
        self._print(
            f"[{self.index}/{self.total}] {message}{took} ({_clock(now - self.start)} so far{left})"
        )
        self.current, self.phase_start = message, now

    def end(self) -> None:
        now = time.monotonic()
        took = self._finish_current(now)
        self._print(f"[done]{took} ({_clock(now - self.start)} in all)")


@contextmanager
def phases(
    total: int,
    first: str,
    counted: Callable[[str], bool],
    lines: bool = False,
    timed: Callable[[str], bool] | None = None,
    timed_total: int = 0,
) -> Iterator[Callable[[str], None]]:
    """A bar over `total` phases. The callback takes each progress message: one for which
    `counted` holds starts the next phase (the one before it is done); others only relabel the
    bar (sub-steps of a phase). `lines`: where stderr is no terminal (no bar is drawn), print
    each phase as a line instead (`_Lines`: `timed` picks the `timed_total` phases whose pace
    predicts the time left)."""
    console = Console(stderr=True)
    plain = None
    if lines and not console.is_terminal:
        plain = _Lines(console, total, timed or counted, timed_total)
    with _bar() as bar:
        task = bar.add_task(first, total=total)
        started = [0]

        def update(message: str) -> None:
            if counted(message):
                if started[0]:
                    bar.advance(task)
                started[0] += 1
                if plain is not None:
                    plain.begin(message)
            bar.update(task, description=message)

        yield update
        bar.update(task, completed=total)
        if plain is not None:
            plain.end()


@contextmanager
def counter(total: int, description: str) -> Iterator[Callable[[str], None]]:
    """A bar over `total` items; the callback marks one done and names the next."""
    with _bar() as bar:
        task = bar.add_task(description, total=total)

        def done(next_label: str) -> None:
            bar.advance(task)
            bar.update(task, description=next_label)

        yield done
