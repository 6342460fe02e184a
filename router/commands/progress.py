"""Progress bars for long commands: a bar with the count, elapsed time and an ETA on stderr
(drawn only on a terminal; piped output stays clean)."""

from __future__ import annotations

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


@contextmanager
def phases(
    total: int, first: str, counted: Callable[[str], bool]
) -> Iterator[Callable[[str], None]]:
    """A bar over `total` phases. The callback takes each progress message: one for which
    `counted` holds starts the next phase (the one before it is done); others only relabel the
    bar (sub-steps of a phase)."""
    with _bar() as bar:
        task = bar.add_task(first, total=total)
        started = [0]

        def update(message: str) -> None:
            if counted(message):
                if started[0]:
                    bar.advance(task)
                started[0] += 1
            bar.update(task, description=message)

        yield update
        bar.update(task, completed=total)


@contextmanager
def counter(total: int, description: str) -> Iterator[Callable[[str], None]]:
    """A bar over `total` items; the callback marks one done and names the next."""
    with _bar() as bar:
        task = bar.add_task(description, total=total)

        def done(next_label: str) -> None:
            bar.advance(task)
            bar.update(task, description=next_label)

        yield done
