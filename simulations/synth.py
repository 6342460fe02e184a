"""Large synthetic traces from a pool of real prompts: arrival times, teams, Parquet output.

Each synthetic request is a real prompt drawn uniformly from the pool (with its real outcomes and
token counts), so quality and cost stay realistic while the trace grows to millions of rows.
Arrivals are a Poisson process whose rate follows a daily cycle (peak at 14:00 UTC, trough at
02:00, peak/trough = (1 + swing) / (1 - swing)); teams are Zipf-distributed, as real usage is
dominated by a few heavy teams.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulations.parquet_io import ParquetTraceWriter
from simulations.trace import ReplayTrace

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class SynthSpec:
    rows: int
    rate_per_s: float = 50.0  # mean arrival rate over a day
    swing: float = 0.5  # daily amplitude of the rate, 0..<1
    teams: int = 20
    zipf: float = 1.1
    start: float = 1_790_000_000.0  # 2026-09-21 UTC; any epoch works
    seed: int = 0
    chunk_rows: int = 1_000_000

    def __post_init__(self) -> None:
        if self.rows < 1 or self.rate_per_s <= 0 or not 0 <= self.swing < 1 or self.teams < 1:
            raise ValueError("rows >= 1, rate > 0, 0 <= swing < 1, teams >= 1 required")


def _cumulative_rate(t: np.ndarray, spec: SynthSpec) -> np.ndarray:
    """Expected arrivals in [0, t] for rate(t) = r (1 - swing cos(2 pi (t - 2h) / day))."""
    w = 2 * np.pi / DAY_S
    phase = 2 * 3600.0
    return spec.rate_per_s * (t - spec.swing / w * (np.sin(w * (t - phase)) - np.sin(-w * phase)))


class ArrivalClock:
    """Non-homogeneous Poisson arrivals by time change: unit-rate gaps mapped through the inverse
    cumulative rate. Stateful, so chunks continue one process."""

    def __init__(self, spec: SynthSpec, rng: np.random.Generator) -> None:
        self._spec = spec
        self._rng = rng
        self._lam = 0.0  # cumulative expected arrivals so far
        horizon = spec.rows / (spec.rate_per_s * (1 - spec.swing)) + DAY_S
        self._grid = np.linspace(0.0, horizon, max(10_000, int(horizon / 60)))
        self._grid_lam = _cumulative_rate(self._grid, spec)

    def next(self, n: int) -> np.ndarray:
        lam = self._lam + np.cumsum(self._rng.exponential(1.0, n))
        self._lam = float(lam[-1])
        return self._spec.start + np.interp(lam, self._grid_lam, self._grid)


def team_names(n: int) -> list[str]:
    return [f"team-{i:03d}" for i in range(n)]


def team_weights(spec: SynthSpec) -> np.ndarray:
    w = 1.0 / np.arange(1, spec.teams + 1) ** spec.zipf
    return w / w.sum()


def pool_from_trace(trace: ReplayTrace) -> ReplayTrace:
    """Rows usable in a synthetic trace: both outcomes known."""
    keep = np.flatnonzero(~np.isnan(trace.quality).any(axis=1))
    if keep.size == 0:
        raise ValueError("no prompt in the pool has both outcomes")
    return trace.take(keep)


def write_synthetic(pool: ReplayTrace, spec: SynthSpec, out: str | Path) -> int:
    """Write spec.rows synthetic requests to `out` (Parquet); returns rows written.

    A pool with scores (pool.scores) adds a `score` column, as a proxy trace records them."""
    rng = np.random.default_rng(spec.seed)
    clock = ArrivalClock(spec, rng)
    weights = team_weights(spec)
    with_scores = pool.scores is not None
    writer = ParquetTraceWriter(out, list(pool.texts), team_names(spec.teams), with_scores)
    written = 0
    try:
        while written < spec.rows:
            n = min(spec.chunk_rows, spec.rows - written)
            pick = rng.integers(0, len(pool), n)
            writer.write(
                ids=[f"syn-{spec.seed}-{i}" for i in range(written, written + n)],
                time=clock.next(n),
                team_idx=rng.choice(spec.teams, size=n, p=weights),
                prompt_idx=pick,
                prompt_tokens=pool.prompt_tokens[pick],
                completion_tokens=pool.completion_tokens[pick],
                quality=pool.quality[pick],
                scores=pool.scores[pick] if pool.scores is not None else None,
            )
            written += n
    finally:
        writer.close()
    return written
