"""Parquet traces: the flat column layout, whole-file reads and streaming record batches.

Layout (one row per request): `id` string, `time` float64 (UNIX s), `team` and `prompt`
dictionary-encoded strings (a trace repeats prompts and teams, so the file stays small and a
reader scores each distinct prompt once), optional `score` float64, `prompt_tokens`,
`completion_tokens_small`, `completion_tokens_large` int32, `outcome_small`, `outcome_large`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from simulations.latency import first_out_of_order
from simulations.trace import ReplayTrace, TraceError

REQUIRED = (
    "time",
    "team",
    "prompt",
    "prompt_tokens",
    "completion_tokens_small",
    "completion_tokens_large",
    "outcome_small",
    "outcome_large",
)
OPTIONAL = ("id", "score")

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("time", pa.float64()),
        ("team", pa.dictionary(pa.int32(), pa.string())),
        ("prompt", pa.dictionary(pa.int32(), pa.string())),
        ("prompt_tokens", pa.int32()),
        ("completion_tokens_small", pa.int32()),
        ("completion_tokens_large", pa.int32()),
        ("outcome_small", pa.float32()),
        ("outcome_large", pa.float32()),
    ]
)


@dataclass(frozen=True, slots=True)
class TraceBatch:
    """One record batch, columns as numpy; strings stay dictionary-encoded."""

    start: int  # row number of the batch's first row in the file
    prompt_idx: np.ndarray
    prompts: list[str]  # the batch's prompt dictionary
    team_idx: np.ndarray
    teams: list[str]
    time: np.ndarray
    prompt_tokens: np.ndarray
    completion_tokens: np.ndarray  # (n, 2)
    quality: np.ndarray  # (n, 2)
    score: np.ndarray | None
    ids: list[str] | None = None  # request ids, when the file has an `id` column

    def __len__(self) -> int:
        return self.time.shape[0]


def _check_columns(path: Path, names: list[str]) -> None:
    for col in REQUIRED:
        if col not in names:
            raise TraceError(f"{path}: missing column {col!r} (columns: {', '.join(names)})")


def _dict_column(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    return arr.indices.to_numpy(zero_copy_only=False), arr.dictionary.to_pylist()


def _numeric(batch: pa.RecordBatch, name: str, path: Path, start: int) -> np.ndarray:
    col = batch.column(name)
    if col.null_count:
        row = start + int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise TraceError(f"{path}: record {row}: missing field {name!r}")
    return col.to_numpy(zero_copy_only=False)


def iter_batches(path: str | Path, batch_rows: int = 262_144) -> Iterator[TraceBatch]:
    """Stream a Parquet trace batch by batch; memory stays bounded by batch_rows."""
    p = Path(path)
    try:
        pf = pq.ParquetFile(p, read_dictionary=["prompt", "team"])
    except (OSError, pa.ArrowInvalid) as exc:
        raise TraceError(f"{p}: not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    _check_columns(p, names)
    columns = [c for c in (*REQUIRED, *OPTIONAL) if c in names]
    start = 0
    last_time = -np.inf
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
        for name in ("prompt", "team", *(("id",) if "id" in columns else ())):
            if batch.column(name).null_count:
                raise TraceError(f"{p}: record {start}: missing field {name!r} (null)")
        prompt_idx, prompts = _dict_column(batch.column("prompt"))
        team_idx, teams = _dict_column(batch.column("team"))
        time = _numeric(batch, "time", p, start)
        _check_order(p, time, start, last_time)
        last_time = float(time[-1]) if time.size else last_time
        yield TraceBatch(
            start=start,
            prompt_idx=prompt_idx,
            prompts=prompts,
            team_idx=team_idx,
            teams=teams,
            time=time,
            prompt_tokens=_numeric(batch, "prompt_tokens", p, start).astype(np.int64),
            completion_tokens=np.stack(
                [_numeric(batch, f"completion_tokens_{r}", p, start) for r in ("small", "large")],
                axis=1,
            ).astype(np.int64),
            quality=np.stack(
                [_numeric(batch, f"outcome_{r}", p, start) for r in ("small", "large")], axis=1
            ).astype(np.float64),
            score=_numeric(batch, "score", p, start).astype(np.float64)
            if "score" in columns
            else None,
            ids=batch.column("id").to_pylist() if "id" in columns else None,
        )
        start += batch.num_rows
    if start == 0:
        raise TraceError(f"{p}: empty trace: no requests to replay")


def _check_order(path: Path, time: np.ndarray, start: int, last: float) -> None:
    i = first_out_of_order(time, last)
    if i is not None:
        before = time[i - 1] if i else last
        raise TraceError(
            f"{path}: record {start + i}: timestamps are not sorted ({time[i]} < previous {before})"
        )


def read_parquet(paths: list[Path]) -> ReplayTrace:
    """Whole trace in memory (for sweeps and tuning); use iter_batches for huge files."""
    parts: list[ReplayTrace] = []
    for path in paths:
        for b in iter_batches(path):
            parts.append(
                ReplayTrace(
                    texts=[b.prompts[i] for i in b.prompt_idx.tolist()],
                    quality=b.quality,
                    prompt_tokens=b.prompt_tokens,
                    completion_tokens=b.completion_tokens,
                    times=b.time.astype(np.float64),
                    teams=np.asarray(b.teams, dtype=object)[b.team_idx],
                    scores=b.score,
                    source=str(path),
                    ids=b.ids,
                )
            )
    return _concat(parts)


def _concat(parts: list[ReplayTrace]) -> ReplayTrace:
    def cat(attr: str) -> np.ndarray | None:
        arrays = [getattr(p, attr) for p in parts]
        return None if any(a is None for a in arrays) else np.concatenate(arrays)

    ids = None if any(p.ids is None for p in parts) else [i for p in parts for i in p.ids or []]

    return ReplayTrace(
        texts=[t for p in parts for t in p.texts],
        quality=np.concatenate([p.quality for p in parts]),
        prompt_tokens=np.concatenate([p.prompt_tokens for p in parts]),
        completion_tokens=np.concatenate([p.completion_tokens for p in parts]),
        source=" + ".join(dict.fromkeys(p.source for p in parts)),
        times=cat("times"),
        teams=cat("teams"),
        scores=cat("scores"),
        ids=ids,
    )


class ParquetTraceWriter:
    """Writes trace chunks with the layout above; prompts/teams given as dictionary indices."""

    def __init__(
        self, path: str | Path, prompts: list[str], teams: list[str], with_scores: bool = False
    ) -> None:
        self._schema = SCHEMA.append(pa.field("score", pa.float64())) if with_scores else SCHEMA
        self._writer = pq.ParquetWriter(str(path), self._schema, compression="zstd")
        # A dictionary with repeated strings makes Parquet fall back to plain encoding (the file
        # grows ~50x), so write distinct prompts and remap the indices.
        unique = list(dict.fromkeys(prompts))
        position = {text: i for i, text in enumerate(unique)}
        self._remap = np.fromiter(
            (position[t] for t in prompts), dtype=np.int32, count=len(prompts)
        )
        self._prompts = pa.array(unique, type=pa.string())
        self._teams = pa.array(teams, type=pa.string())

    def write(
        self,
        ids: list[str],
        time: np.ndarray,
        team_idx: np.ndarray,
        prompt_idx: np.ndarray,
        prompt_tokens: np.ndarray,
        completion_tokens: np.ndarray,
        quality: np.ndarray,
        scores: np.ndarray | None = None,
    ) -> None:
        if (scores is not None) != ("score" in self._schema.names):
            raise ValueError("scores must be given exactly when the writer has a score column")
        extra = [] if scores is None else [pa.array(scores, pa.float64())]
        table = pa.Table.from_arrays(
            [
                pa.array(ids, type=pa.string()),
                pa.array(time, type=pa.float64()),
                pa.DictionaryArray.from_arrays(pa.array(team_idx, pa.int32()), self._teams),
                pa.DictionaryArray.from_arrays(pa.array(self._remap[prompt_idx]), self._prompts),
                pa.array(prompt_tokens, pa.int32()),
                pa.array(completion_tokens[:, 0], pa.int32()),
                pa.array(completion_tokens[:, 1], pa.int32()),
                pa.array(quality[:, 0], pa.float32()),
                pa.array(quality[:, 1], pa.float32()),
                *extra,
            ],
            schema=self._schema,
        )
        self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()
