"""The simulator's one entry point for reading a trace, whatever its format: JSONL traces and
RouteLLM CSVs through the one loader (classifiers.dataset), Parquet through simulations/parquet_io.
"""

from __future__ import annotations

from pathlib import Path

from classifiers.dataset import DatasetError, load_dataset
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
    parquet = [Path(p) for p in paths if str(p).endswith(".parquet")]
    others = [p for p in paths if not str(p).endswith(".parquet")]
    if parquet and others:
        raise TraceError("give either Parquet traces or JSONL/CSV traces, not both at once")
    if parquet:
        return read_parquet(parquet)
    try:
        ds = load_dataset(
            others,
            small=small_column,
            large=large_column,
            exclude_contaminated=exclude_contaminated,
            require_outcomes=require_outcomes,
            context_turns=context_turns,
        )
    except DatasetError as exc:
        raise TraceError(str(exc)) from None
    return from_dataset(ds, default_completion_tokens)
