"""The simulator's one entry point for reading a trace, whatever its format: JSONL traces and
RouteLLM CSVs through the one loader (classifiers.dataset, which merges a proxy trace folder's
labels and feedback into the records), Parquet through simulations/parquet_io.

`load_labelled_trace` is what the commands use: a proxy trace folder holds many requests nobody
labelled yet, and those are left out (and said so) rather than failing the replay. Scores can come
from a file (`with_scores`: `classifier train`'s out-of-fold scores) instead of a model.

Rows come out in arrival-time order whenever every record has a time: the proxy writes a record
when its request finishes, stamped with when it arrived, so under concurrent traffic (and across
several replicas' files) the files are not in time order. The trace is in memory already, so a
stable sort puts it in order exactly, with no bound on how late a record was written; the replays
over time (`simulate --budgets`, `what-if`) then see the arrivals as they happened, and errors
still name each record's file row. Streaming readers use trace_format/reader.py's bounded
`iter_lines_by_time` instead.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from classifiers.dataset import DatasetError, RoutingDataset, load_dataset
from classifiers.oof import read_scores
from simulations.parquet_io import read_parquet
from simulations.trace import ReplayTrace, TraceError, from_dataset


def load_trace(
    paths: list[str | Path],
    small_column: str | None = None,
    large_column: str | None = None,
    default_completion_tokens: int | None = None,
    exclude_contaminated: bool = True,
    require_outcomes: bool = True,
    context_turns: int = 2,
) -> ReplayTrace:
    """JSONL traces and RouteLLM CSVs through the one loader; `.parquet` files directly."""
    trace, _notes = _load(
        paths,
        small_column,
        large_column,
        default_completion_tokens,
        exclude_contaminated,
        require_outcomes,
        context_turns,
        labelled_only=False,
    )
    return trace


def load_labelled_trace(
    paths: list[str | Path],
    small_column: str | None = None,
    large_column: str | None = None,
    default_completion_tokens: int | None = None,
    context_turns: int = 2,
) -> tuple[ReplayTrace, list[str]]:
    """Like load_trace, leaving out requests without both outcomes (or without text); returns
    the trace and notes saying what was left out. No request left: TraceError naming the first."""
    return _load(
        paths,
        small_column,
        large_column,
        default_completion_tokens,
        True,
        True,
        context_turns,
        labelled_only=True,
    )


def _load(
    paths: list[str | Path],
    small_column: str | None,
    large_column: str | None,
    default_completion_tokens: int | None,
    exclude_contaminated: bool,
    require_outcomes: bool,
    context_turns: int,
    labelled_only: bool,
) -> tuple[ReplayTrace, list[str]]:
    parquet = [Path(p) for p in paths if str(p).endswith(".parquet")]
    others = [p for p in paths if not str(p).endswith(".parquet")]
    if parquet and others:
        raise TraceError("give either Parquet traces or JSONL/CSV traces, not both at once")
    if parquet:
        return read_parquet(parquet), []
    try:
        ds = load_dataset(
            others,
            small=small_column,
            large=large_column,
            exclude_contaminated=exclude_contaminated,
            require_outcomes=require_outcomes,
            context_turns=context_turns,
            labelled_only=labelled_only,
        )
    except DatasetError as exc:
        raise TraceError(str(exc)) from None
    if not len(ds) and ds.first_unlabelled:
        raise TraceError(
            f"no labelled requests: {ds.unlabelled} have no outcomes (first: {ds.first_unlabelled})"
        )
    return in_time_order(from_dataset(ds, default_completion_tokens)), _notes(ds)


def in_time_order(trace: ReplayTrace) -> ReplayTrace:
    """The trace sorted by arrival time (stable: ties keep file order); as it is when a record
    has no time (a RouteLLM CSV: the replays over time then say the time is missing)."""
    if not trace.has_times():
        return trace
    assert trace.times is not None
    order = np.argsort(trace.times, kind="stable")
    if bool((order == np.arange(order.shape[0])).all()):
        return trace
    return trace.take(order)


def _notes(ds: RoutingDataset) -> list[str]:
    if not (ds.unlabelled or ds.without_text):
        return []
    return [
        f"note: replaying {len(ds)} labelled requests; left out {ds.unlabelled} without both "
        f"outcomes and {ds.without_text} without a logged prompt"
    ]


def with_scores(trace: ReplayTrace, path: str | Path) -> ReplayTrace:
    """The trace with each request's score from a scores file (`<model>.oof.jsonl`), by request
    id; TraceError naming the first request the file has no score for."""
    try:
        by_id = read_scores(path)
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    units = trace.units()
    missing = [i for i, rid in enumerate(units) if rid not in by_id]
    if missing:
        raise TraceError(
            f"{trace.record(missing[0])}: request {units[missing[0]]!r} has no score in {path} "
            f"({len(missing)} of {len(units)} requests have none)"
        )
    return replace(trace, scores=np.asarray([by_id[rid] for rid in units], dtype=np.float64))
