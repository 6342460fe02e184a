"""`drift report`'s engine (simulations/drift_report.py, drift_sources.py): windows, flags and
advice on synthetic streams with known shifts, and the two inputs it streams (a JSONL trace folder
with its labels, a date-partitioned Parquet dataset)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from classifiers.score_reference import ScoreReference
from simulations.drift_limits import DriftLimits
from simulations.drift_report import build_report
from simulations.drift_sources import DriftBatch, DriftInputError, Tiers, iter_source
from trace_format.labels import LabelRecord

DAY0 = 1_780_000_000.0 - 1_780_000_000.0 % 86_400  # a UTC midnight
THRESHOLD = 0.6


def stream(
    hours: int,
    seed: int,
    shift_at: int | None = None,
    a_after: float = 2.0,
    small_after: float = 0.6,
    per_hour: int = 1000,
) -> list[DriftBatch]:
    """`per_hour` requests an hour; from hour `shift_at`, scores ~ Beta(a_after, 3) and the small
    tier right with probability `small_after` (before: Beta(2, 3) and 0.6)."""
    rng = np.random.default_rng(seed)
    out = []
    for h in range(hours):
        after = shift_at is not None and h >= shift_at
        n = per_hour
        score = rng.beta(a_after if after else 2.0, 3.0, n)
        large = score >= THRESHOLD
        small_q = (rng.random(n) < (small_after if after else 0.6)).astype(float)
        large_q = (rng.random(n) < 0.8).astype(float)
        out.append(
            DriftBatch(
                time=DAY0 + h * 3600 + np.sort(rng.random(n)) * 3599,
                score=score,
                tiered=np.ones(n, bool),
                large=large,
                cost=np.where(large, 0.01, 0.001),
                routed_outcome=np.where(large, large_q, small_q),
                large_outcome=large_q,
                error=np.zeros(n, bool),
            )
        )
    return out


def reference(seed: int = 99) -> ScoreReference:
    return ScoreReference.from_scores(np.random.default_rng(seed).beta(2.0, 3.0, 50_000), "ref")


def target() -> float:
    return reference().share_at_or_above(THRESHOLD)


# Stationary quality retained: (0.82 * 0.6 + 0.18 * 0.8) / 0.8 = 0.795.
LIMITS = DriftLimits(quality_limit=0.75, min_labels=100)


def test_stationary_stream_raises_no_flag() -> None:
    rep = build_report(stream(48, seed=1), "1h", reference(), THRESHOLD, target(), LIMITS)
    assert len(rep.windows) == 48 and rep.requests == 48_000
    assert not rep.alert, [w.flags for w in rep.flagged]
    w = rep.windows[0]
    share = w.large_share
    assert w.cost_per_1k == pytest.approx(1000 * (0.01 * share + 0.001 * (1 - share)))
    assert not rep.retrain_advised
    assert rep.restore is not None and abs(rep.restore[1] - THRESHOLD) < 0.05


def test_topic_shift_flags_drift_and_share_and_suggests_threshold() -> None:
    rep = build_report(
        stream(24, seed=2, shift_at=12, a_after=3.0), "1h", reference(), THRESHOLD, target(), LIMITS
    )
    flagged = [int((w.start - DAY0) // 3600) for w in rep.flagged]
    assert flagged and min(flagged) >= 12 and 12 in flagged
    reasons = " ".join(f for w in rep.flagged for f in w.flags)
    assert "score drift" in reasons and "large share" in reasons
    assert rep.restore is not None
    new_scores = np.random.default_rng(0).beta(3.0, 3.0, 200_000)
    assert abs(float(np.mean(new_scores >= rep.restore[1])) - target()) < 0.03


def test_small_tier_degrading_flags_quality_and_advises_retraining() -> None:
    rep = build_report(
        stream(12, seed=3, shift_at=6, small_after=0.2),
        "1h",
        reference(),
        THRESHOLD,
        target(),
        LIMITS,
    )
    late = [w for w in rep.windows if w.start >= DAY0 + 6 * 3600]
    assert all(any(f.startswith("quality retained") for f in w.flags) for w in late)
    assert not any(w.flags for w in rep.windows if w.start < DAY0 + 6 * 3600)
    assert rep.retrain_advised


def test_daily_windows_and_first_window_baseline() -> None:
    rep = build_report(stream(72, seed=4), "1d", None, THRESHOLD, None, LIMITS)
    assert [w.n for w in rep.windows] == [24_000] * 3
    assert rep.reference_source == "the first window" and rep.windows[0].psi == 0.0
    assert not rep.alert


def write_parquet_days(root: Path, days: int, per_day: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for d in range(days):
        folder = root / f"date=2026-11-{d + 1:02d}"
        folder.mkdir(parents=True)
        score = rng.beta(2.0, 3.0, per_day)
        table = pa.table(
            {
                "time": DAY0 + d * 86_400 + np.sort(rng.random(per_day)) * 86_399,
                "score": score,
                "prompt_tokens": np.full(per_day, 100, np.int32),
                "completion_tokens_small": np.full(per_day, 50, np.int32),
                "completion_tokens_large": np.full(per_day, 50, np.int32),
                "outcome_small": (rng.random(per_day) < 0.6).astype(np.float32),
                "outcome_large": (rng.random(per_day) < 0.8).astype(np.float32),
            }
        )
        pq.write_table(table, folder / "part-0.parquet")


def test_parquet_dataset_streams_in_batches_and_decides_tiers(tmp_path: Path) -> None:
    write_parquet_days(tmp_path / "ds", days=3, per_day=5000, seed=5)
    from backends.config import Price

    tiers = Tiers(
        "small",
        "large",
        THRESHOLD,
        (Price(input_per_mtok=1, output_per_mtok=1), Price(input_per_mtok=10, output_per_mtok=10)),
    )
    batches = list(iter_source(str(tmp_path / "ds"), tiers, batch_rows=4096))
    assert len(batches) > 3 and sum(len(b) for b in batches) == 15_000
    rep = build_report(iter(batches), "1d", reference(), THRESHOLD, target(), LIMITS)
    assert [w.n for w in rep.windows] == [5000] * 3 and not rep.alert
    w = rep.windows[0]
    # 150 tokens at 1 or 10 USD per Mtok.
    assert w.cost_per_1k == pytest.approx(1000 * 150e-6 * (1 + 9 * w.large_share))
    assert w.labels == 5000
    # A URI goes through pyarrow's filesystems, as s3:// or gs:// would.
    uri = (tmp_path / "ds").as_uri()
    assert sum(len(b) for b in iter_source(uri, tiers)) == 15_000
    with pytest.raises(DriftInputError, match="threshold"):
        list(iter_source(str(tmp_path / "ds"), Tiers("small", "large")))
    with pytest.raises(DriftInputError, match="not a readable Parquet dataset"):
        list(iter_source("file:///nonexistent/drift", tiers))


def test_jsonl_folder_merges_labels_by_request_id(tmp_path: Path) -> None:
    lines, labels = [], []
    for i in range(300):
        large = i % 3 == 0
        lines.append(
            {
                "schema_version": 1,
                "id": f"r{i}",
                "time": DAY0 + i,
                "policy": "p",
                "score": 0.7 if large else 0.2,
                "tier": "large" if large else "small",
                "cost_usd": 0.01 if large else 0.001,
                "status": 200,
            }
        )
        if i % 2 == 0:
            labels.append(
                LabelRecord(
                    request_id=f"r{i}",
                    judge="reference",
                    outcomes={"small": 0.0 if i % 4 == 0 else 1.0, "large": 1.0},
                )
            )
    (tmp_path / "requests.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    (tmp_path / "labels.jsonl").write_bytes(b"".join(lab.line() for lab in labels))
    rep = build_report(
        iter_source(str(tmp_path), Tiers("small", "large")), "1h", None, None, None, LIMITS
    )
    (w,) = rep.windows
    assert w.n == 300 and w.labels == 150 and w.large_share == pytest.approx(100 / 300)
    assert w.retained is not None
    routed = [1.0 if (i % 3 == 0 or i % 4 != 0) else 0.0 for i in range(0, 300, 2)]
    assert w.retained.value == pytest.approx(np.mean(routed))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "requests.jsonl").write_text('{"schema_version": 1, "id": "x"}\n')
    with pytest.raises(DriftInputError, match="line 1"):
        list(iter_source(str(bad), Tiers("small", "large")))


def test_parquet_tier_cost_and_policy_columns_are_used(tmp_path: Path) -> None:
    n = 1200
    tier = pa.array(
        ["large" if i % 4 == 0 else "small" if i % 4 != 3 else None for i in range(n)]
    ).dictionary_encode()
    pq.write_table(
        pa.table(
            {
                "time": DAY0 + np.arange(n, dtype=float),
                "score": np.linspace(0, 1, n),
                "tier": tier,
                "cost_usd": np.where(np.arange(n) % 4 == 0, 0.01, 0.001),
                "policy": ["a" if i % 2 == 0 else "b" for i in range(n)],
                "status": np.where(np.arange(n) % 4 == 3, 429, 200),
            }
        ),
        tmp_path / "t.parquet",
    )
    (w,) = build_report(
        iter_source(str(tmp_path / "t.parquet"), Tiers("small", "large")),
        "1h",
        None,
        None,
        None,
        LIMITS,
    ).windows
    # Every 4th request large, every 4th (i % 4 == 3) refused before routing.
    assert w.n == n and w.large_share == pytest.approx(1 / 3) and w.error_rate == 0.25
    (a,) = build_report(
        iter_source(str(tmp_path / "t.parquet"), Tiers("small", "large", policy="a")),
        "1h",
        None,
        None,
        None,
        LIMITS,
    ).windows
    assert a.n == n // 2 and a.large_share == pytest.approx(0.5)
