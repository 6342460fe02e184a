"""Independent fits in forked worker processes that share one prepared input.

A fit is single-threaded CPU work, so two cores fit two at once. What every fit reads (a data
set's model inputs, tens of MB) is set here once before the workers fork, so each worker reads
the parent's copy instead of unpickling its own for every task. Offline only (benchmarks and
the leave-one-source-out report); fork, so POSIX only.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_SHARED: Any = None


def shared() -> Any:
    """The input `forked_map` was given: in the parent while it runs, and in its workers."""
    if _SHARED is None:
        raise RuntimeError("shared() is only set while forked_map runs")
    return _SHARED


def forked_map(fn: Callable[[T], R], items: Sequence[T], data: Any, jobs: int = 1) -> Iterator[R]:
    """`fn` of each item, in order, lazily, each `fn` reading `data` through `shared()`. With
    `jobs` > 1, in that many forked worker processes (ProcessPoolExecutor.map); else here, one
    item per `next()`. The results do not depend on `jobs`."""
    global _SHARED
    # Nested calls (an out-of-fold report inside a benchmark's forked fit) restore the outer
    # input when they finish.
    outer, _SHARED = _SHARED, data
    try:
        if jobs <= 1:
            yield from map(fn, items)
        else:
            context = multiprocessing.get_context("fork")  # the workers inherit `data`
            with ProcessPoolExecutor(jobs, mp_context=context) as pool:
                yield from pool.map(fn, items)
    finally:
        _SHARED = outer
