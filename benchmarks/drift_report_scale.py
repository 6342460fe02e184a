"""`drift report` at scale: 30 days x 1M requests/day from date-partitioned Parquet.

    .venv/bin/python -m benchmarks.drift_report_scale [--days 30] [--per-day 1000000]
        [--window 1h] [--out DIR] [--keep] [--small-days 3]

Writes a synthetic dataset (`<out>/traces/date=YYYY-MM-DD/part-0.parquet`: `time`, `score`,
`tier`, `cost_usd`, `policy`, `status`, and `outcome_small`/`outcome_large` on a 2% labelled
sample (small right 78% of the time, large 80%: quality retained about 0.98, inside its limit);
scores Beta(2, 3), shifted to Beta(3, 3) from two thirds of the way through so the report
has something to flag), a reference from an independent sample of the same distribution, then
runs `cost-router drift report` on it as a subprocess and prints its wall time and peak RSS
(getrusage of the child). With --small-days N it first runs the same report over the first N days
alone: bounded memory means the peak RSS barely moves with the number of days. Synthetic scores
and tiers are fine here: this measures streaming, not detection (benchmarks/drift_detection.py).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from classifiers.score_reference import ScoreReference

T0 = 1_780_000_000.0 - 1_780_000_000.0 % 86_400
THRESHOLD = 0.6


def write_dataset(root: Path, days: int, per_day: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    tiers = pa.array(["small", "large"])
    shift_day = days * 2 // 3
    bytes_written = 0
    for d in range(days):
        day = datetime.fromtimestamp(T0 + d * 86_400, UTC).strftime("%Y-%m-%d")
        folder = root / f"date={day}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "part-0.parquet"
        with pq.ParquetWriter(path, _schema(), compression="zstd") as writer:
            for chunk in np.array_split(np.arange(per_day), 4):
                n = len(chunk)
                a = 3.0 if d >= shift_day else 2.0
                score = rng.beta(a, 3.0, n).astype(np.float32)
                large = score >= THRESHOLD
                labelled = rng.random(n) < 0.02
                small_q = np.where(labelled, (rng.random(n) < 0.78), np.nan).astype(np.float32)
                large_q = np.where(labelled, (rng.random(n) < 0.8), np.nan).astype(np.float32)
                writer.write_table(
                    pa.table(
                        {
                            "time": T0 + d * 86_400 + chunk * (86_400 / per_day),
                            "score": score,
                            "tier": pa.DictionaryArray.from_arrays(
                                pa.array(large.astype(np.int8)), tiers
                            ),
                            "cost_usd": np.where(large, 0.004, 0.0003),
                            "policy": pa.DictionaryArray.from_arrays(
                                pa.array(np.zeros(n, np.int8)), pa.array(["balanced"])
                            ),
                            "status": np.full(n, 200, np.int16),
                            "outcome_small": small_q,
                            "outcome_large": large_q,
                        },
                        schema=_schema(),
                    )
                )
        bytes_written += path.stat().st_size
    return bytes_written


def _schema() -> pa.Schema:
    return pa.schema(
        [
            ("time", pa.float64()),
            ("score", pa.float32()),
            ("tier", pa.dictionary(pa.int8(), pa.string())),
            ("cost_usd", pa.float64()),
            ("policy", pa.dictionary(pa.int8(), pa.string())),
            ("status", pa.int16()),
            ("outcome_small", pa.float32()),
            ("outcome_large", pa.float32()),
        ]
    )


def run_report(traces: Path, ref: Path, window: str, out: Path) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MiB, exit status) of one `cost-router drift report`."""
    cmd = [
        sys.executable,
        "-m",
        "router.cli",
        "drift",
        "report",
        "-t",
        str(traces),
        "-r",
        str(ref),
        "--window",
        window,
        "--target",
        "0.18",
        "-o",
        str(out),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    if proc.returncode not in (0, 1):
        sys.exit(f"drift report failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    # ru_maxrss of children is the largest child so far: run the smaller dataset first.
    return wall, max(peak, before) / 1024, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--per-day", type=int, default=1_000_000)
    parser.add_argument("--window", choices=["1h", "1d"], default="1h")
    parser.add_argument(
        "--small-days",
        type=int,
        default=3,
        help="also report over the first N days first (0: skip)",
    )
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the dataset")
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="drift-scale-"))
    traces = work / "traces"
    try:
        started = time.perf_counter()
        size = write_dataset(traces, args.days, args.per_day)
        print(
            f"wrote {args.days} days x {args.per_day:,} requests ({args.days * args.per_day:,})"
            f" to {traces}: {size / 2**20:.0f} MiB in {time.perf_counter() - started:.0f} s"
        )
        ref = work / "reference.scores.json"
        sample = np.random.default_rng(1).beta(2.0, 3.0, 200_000)
        ScoreReference.from_scores(sample, "Beta(2, 3) sample").save(ref)
        if 0 < args.small_days < args.days:
            small = work / "small"
            for part in sorted(traces.iterdir())[: args.small_days]:
                (small / part.name).mkdir(parents=True)
                shutil.copy(part / "part-0.parquet", small / part.name / "part-0.parquet")
            wall, rss, code = run_report(small, ref, args.window, work / "report-small")
            rate = args.small_days * args.per_day / wall
            print(
                f"{args.small_days} days: {wall:.1f} s ({rate:,.0f} requests/s), peak RSS "
                f"{rss:.0f} MiB, exit {code}"
            )
        wall, rss, code = run_report(traces, ref, args.window, work / "report")
        rate = args.days * args.per_day / wall
        print(
            f"{args.days} days: {wall:.1f} s ({rate:,.0f} requests/s), peak RSS {rss:.0f} MiB, "
            f"exit {code} (1: the shift from day {args.days * 2 // 3 + 1} is flagged)"
        )
    finally:
        if not args.keep and args.out is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
