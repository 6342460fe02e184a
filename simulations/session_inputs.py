"""What `simulate --sessions`, `tune --sessions` and `what-if --sessions` give a session replay
(simulations/sessions.py) besides the trace: the prompt cache model the options choose, and the
outcomes the trace folder's labels, feedback and records hold, for quality.

Quality of a session replay is measured on the **graded** requests: those with an outcome for
every tier the policy routes between (a label per tier, e.g. `cost-router grades import`). The
other requests are still replayed (a conversation's every turn moves the cache and the session's
tier), but carry no quality; the reports say over how many requests quality was measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from classifiers.dataset import beside_outcomes
from simulations.sessions import (
    DEFAULT_CACHE_TTL_S,
    DEFAULT_HIT_RATE,
    CacheModel,
    SessionReplay,
    SessionTrace,
    measure_cache,
)
from simulations.trace import TraceError
from trace_format.reader import TraceFormatError, data_files, is_trace_file, iter_records


@dataclass(frozen=True, slots=True)
class CacheOptions:
    """The commands' cache options: `hit_rate` None measures each tier's from the trace."""

    ttl_s: float = DEFAULT_CACHE_TTL_S
    hit_rate: float | None = None
    block: int = 1


def cache_model(trace: SessionTrace, options: CacheOptions) -> CacheModel:
    """The cache model the options give: measured from the trace's `cached_tokens` (the
    default hit rate where it cannot be), or the one hit rate given for every tier."""
    if options.hit_rate is None:
        return measure_cache(
            trace,
            default_ttl_s=options.ttl_s,
            default_hit_rate=DEFAULT_HIT_RATE,
            default_block=options.block,
        )
    return CacheModel(
        default_ttl_s=options.ttl_s, default_hit_rate=options.hit_rate, default_block=options.block
    )


def graded_outcomes(paths: Iterable[str | Path]) -> dict[str, dict[str, float]]:
    """Outcomes per request id, {tier: quality}, of the trace files at `paths`: each record's
    own `outcomes` merged with the labels and feedback beside it (the one rule,
    classifiers.dataset's); requests with none are left out."""
    out: dict[str, dict[str, float]] = {}
    for path in paths:
        try:
            files = [f for f in data_files(path) if is_trace_file(f)]
            for file in files:
                beside = beside_outcomes(file)
                for _, record in iter_records(file):
                    outcomes, _ = beside.outcomes(record)
                    if outcomes:
                        out[record.id] = outcomes
        except TraceFormatError as exc:
            raise TraceError(str(exc)) from None
    return out


@dataclass(frozen=True)
class Graded:
    """The requests of a session trace graded on every tier the policy routes between."""

    rows: np.ndarray  # row indices into the session trace
    outcomes: list[Mapping[str, float]]  # per graded row, {tier: quality}
    tiers: tuple[str, ...]

    @classmethod
    def of(
        cls,
        trace: SessionTrace,
        outcomes: Mapping[str, Mapping[str, float]],
        tiers: Sequence[str],
    ) -> Graded:
        rows = [
            i
            for i, rid in enumerate(trace.ids)
            if rid in outcomes and all(t in outcomes[rid] for t in tiers)
        ]
        return cls(
            np.asarray(rows, dtype=np.int64), [outcomes[trace.ids[i]] for i in rows], tuple(tiers)
        )

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def quality(self, run: SessionReplay) -> float | None:
        """Mean outcome of the tier each graded request landed on (0 where refused)."""
        if not len(self):
            return None
        got = [
            0.0 if run.tiers[i] is None else float(o.get(str(run.tiers[i]), 0.0))
            for i, o in zip(self.rows.tolist(), self.outcomes, strict=True)
        ]
        return float(np.mean(got))

    def on(self, tier: str) -> np.ndarray:
        """Every graded request's outcome on `tier`."""
        return np.asarray([o[tier] for o in self.outcomes], dtype=np.float64)
