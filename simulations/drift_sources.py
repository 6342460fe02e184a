"""What `drift report` reads, as a stream of column batches: a JSONL trace folder (through the one
trace reader, with the folder's labels and feedback merged in by request id) or a
date-partitioned Parquet dataset (pyarrow.dataset, so `s3://`, `gs://` and local paths read the
same way). Memory stays bounded by the batch size: nothing holds the whole trace.

Parquet columns (simulations/parquet_io.py's layout, plus two optional ones): `time`, `score`,
and optionally `tier` (the tier that answered; without it the tier is the policy's decision,
score >= threshold), `cost_usd` (without it, the cost is priced from `prompt_tokens` and
`completion_tokens_small|large` when prices are given), `outcome_small`, `outcome_large`
(offline traces carry both: every row is labelled), `policy` (kept when `policy` is asked for).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from backends.config import NANOS_PER_USD, Price, cost_nanos
from classifiers.dataset import beside_outcomes
from trace_format.reader import TraceFormatError, is_trace_file, iter_records, trace_files

BATCH_ROWS = 131_072


class DriftInputError(ValueError):
    """Input `drift report` cannot read; the message names the file, line or column."""


@dataclass(frozen=True, slots=True)
class DriftBatch:
    """Requests in arrival order; NaN where a value is unknown."""

    time: np.ndarray  # float64 UNIX s
    score: np.ndarray  # float64
    tiered: np.ndarray  # bool: answered by a tier (not refused before routing)
    large: np.ndarray  # bool: answered by the large tier
    cost: np.ndarray  # float64 USD
    routed_outcome: np.ndarray  # float64: quality of the answer the client got
    large_outcome: np.ndarray  # float64: quality the large tier would have given
    error: np.ndarray  # bool: HTTP status >= 400

    def __len__(self) -> int:
        return self.time.shape[0]


@dataclass(frozen=True)
class Tiers:
    small: str
    large: str
    threshold: float | None = None  # decides the tier where the data records none
    prices: tuple[Price, Price] | None = None  # (small, large), to price tokens
    policy: str | None = None  # keep only this policy's requests (records naming one)


def is_parquet_source(source: str) -> bool:
    """A Parquet dataset: a URI, a .parquet file, or a folder holding .parquet files."""
    if "://" in source:
        return True
    p = Path(source)
    if p.is_file():
        return p.suffix == ".parquet"
    return p.is_dir() and next(p.rglob("*.parquet"), None) is not None


def iter_source(source: str, tiers: Tiers, batch_rows: int = BATCH_ROWS) -> Iterator[DriftBatch]:
    if is_parquet_source(source):
        yield from _iter_parquet(source, tiers, batch_rows)
    else:
        yield from _iter_jsonl(source, tiers, batch_rows)


class _Columns:
    """Row-by-row collector for JSONL records, flushed as a DriftBatch every batch_rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, bool, bool, float, float, float, bool]] = []

    def batch(self) -> DriftBatch:
        cols = list(zip(*self.rows, strict=True)) if self.rows else [()] * 8
        self.rows = []
        f = [np.asarray(c, dtype=np.float64) for c in cols]
        return DriftBatch(
            time=f[0],
            score=f[1],
            tiered=f[2].astype(bool),
            large=f[3].astype(bool),
            cost=f[4],
            routed_outcome=f[5],
            large_outcome=f[6],
            error=f[7].astype(bool),
        )


def _iter_jsonl(source: str, tiers: Tiers, batch_rows: int) -> Iterator[DriftBatch]:
    path = Path(source)
    if not path.exists():
        raise DriftInputError(f"{path}: not found (no such file or folder)")
    try:
        files = trace_files([path]) if path.is_dir() else [path]
    except TraceFormatError as exc:
        raise DriftInputError(str(exc)) from None
    files = [f for f in files if is_trace_file(f)]
    if not files:
        raise DriftInputError(f"{path}: no trace files (*.jsonl) or Parquet files found")
    nan = float("nan")
    cols = _Columns()
    for file in files:
        beside = beside_outcomes(file)
        try:
            for _, rec in iter_records(file):
                if tiers.policy is not None and rec.policy not in (None, tiers.policy):
                    continue
                outcomes, _ = beside.outcomes(rec)
                outcomes = outcomes or {}
                routed = outcomes.get(rec.tier, nan) if rec.tier else nan
                cols.rows.append(
                    (
                        rec.time,
                        nan if rec.score is None else rec.score,
                        rec.tier is not None,
                        rec.tier == tiers.large,
                        nan if rec.cost_usd is None else rec.cost_usd,
                        routed,
                        outcomes.get(tiers.large, nan),
                        rec.status is not None and rec.status >= 400,
                    )
                )
                if len(cols.rows) >= batch_rows:
                    yield cols.batch()
        except TraceFormatError as exc:
            raise DriftInputError(str(exc)) from None
    if cols.rows:
        yield cols.batch()


PARQUET_COLUMNS = (
    "time",
    "score",
    "tier",
    "cost_usd",
    "policy",
    "status",
    "outcome_small",
    "outcome_large",
    "prompt_tokens",
    "completion_tokens_small",
    "completion_tokens_large",
)


def _dataset(source: str) -> pads.Dataset:
    try:
        # Hive-style partitions (`date=2026-11-01/part-0.parquet`) become a column we never read;
        # plain date folders (`2026-11-01/...`) work too: the files are found either way.
        return pads.dataset(source, format="parquet", partitioning="hive")
    except (OSError, pa.ArrowInvalid, ValueError) as exc:
        raise DriftInputError(f"{source}: not a readable Parquet dataset ({exc})") from None


def _float(batch: pa.RecordBatch, name: str) -> np.ndarray:
    col = batch.column(name)
    return col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _iter_parquet(source: str, tiers: Tiers, batch_rows: int) -> Iterator[DriftBatch]:
    ds = _dataset(source)
    names = set(ds.schema.names)
    for need in ("time", "score"):
        if need not in names:
            raise DriftInputError(
                f"{source}: missing column {need!r} (columns: {', '.join(sorted(names))})"
            )
    if "tier" not in names and tiers.threshold is None:
        raise DriftInputError(
            f"{source}: no 'tier' column, and no threshold to decide the tier "
            "(give --threshold or a config whose policy has one)"
        )
    columns = [c for c in PARQUET_COLUMNS if c in names]
    filt = None
    if tiers.policy is not None and "policy" in names:
        filt = pads.field("policy") == tiers.policy
    # One fragment (file) at a time: a single scanner over the whole dataset decodes ahead of a
    # slower consumer without bound (peak RSS grew from 420 MiB at 3 days to 970 MiB at 30 days
    # of 1M requests), whatever its readahead settings; per fragment, the backlog is at most one.
    try:
        for fragment in ds.get_fragments(filter=filt):
            # The dataset's schema: partition fields (`date=`, `policy=` folders) are columns too.
            for batch in fragment.to_batches(
                schema=ds.schema,
                columns=columns,
                filter=filt,
                batch_size=batch_rows,
                batch_readahead=2,
            ):
                if batch.num_rows:
                    yield _parquet_batch(batch, names, tiers)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DriftInputError(f"{source}: {exc}") from None


def _parquet_batch(batch: pa.RecordBatch, names: set[str], tiers: Tiers) -> DriftBatch:
    n = batch.num_rows
    time = _float(batch, "time")
    score = _float(batch, "score")
    if "tier" in names:
        tier = batch.column("tier")
        if pa.types.is_dictionary(tier.type):
            tier = tier.dictionary_decode()
        tiered = pc.is_valid(tier).to_numpy(zero_copy_only=False)
        large = pc.fill_null(pc.equal(tier, tiers.large), False).to_numpy(zero_copy_only=False)
    else:
        assert tiers.threshold is not None
        tiered = ~np.isnan(score)
        large = tiered & (score >= tiers.threshold)
    nan = np.full(n, np.nan)
    small_q = _float(batch, "outcome_small") if "outcome_small" in names else nan
    large_q = _float(batch, "outcome_large") if "outcome_large" in names else nan
    routed = np.where(large, large_q, small_q)
    routed[~tiered] = np.nan
    if "cost_usd" in names:
        cost = _float(batch, "cost_usd")
    elif (
        tiers.prices is not None
        and {"prompt_tokens", "completion_tokens_small", "completion_tokens_large"} <= names
    ):
        prompt = _float(batch, "prompt_tokens")
        small_p, large_p = tiers.prices
        cost_small = cost_nanos(
            small_p.input_per_mtok,
            small_p.output_per_mtok,
            prompt,
            _float(batch, "completion_tokens_small"),
        )
        cost_large = cost_nanos(
            large_p.input_per_mtok,
            large_p.output_per_mtok,
            prompt,
            _float(batch, "completion_tokens_large"),
        )
        cost = np.where(large, cost_large, cost_small) / NANOS_PER_USD
    else:
        cost = nan
    error = (_float(batch, "status") >= 400) if "status" in names else np.zeros(n, bool)
    return DriftBatch(
        time=time,
        score=score,
        tiered=tiered,
        large=large,
        cost=cost,
        routed_outcome=routed,
        large_outcome=large_q,
        error=error,
    )
