"""Synthetic Parquet traces and the streaming replay, checked against the in-memory replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simulations.parquet_io import iter_batches
from simulations.replay import replay, score_texts, trace_scores
from simulations.stream import stream_replay
from simulations.sweep import default_thresholds, sweep
from simulations.synth import SynthSpec, pool_from_trace, team_weights, write_synthetic
from simulations.trace import TraceError
from simulations.trace_loader import load_trace
from tests.support.sim import GSM8K, sim_config


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    pool = pool_from_trace(load_trace([GSM8K]))
    out = tmp_path_factory.mktemp("synth") / "t.parquet"
    spec = SynthSpec(rows=30_000, rate_per_s=20, teams=5, seed=3, chunk_rows=7_000)
    assert write_synthetic(pool, spec, out) == 30_000
    return out, spec


def test_synthetic_trace_shape(synthetic: tuple) -> None:
    path, spec = synthetic
    trace = load_trace([path])
    assert len(trace) == 30_000
    times = trace.require_times()
    assert (np.diff(times) >= 0).all()
    # Mean rate ~ 20/s over the synthetic span (the daily cycle averages out only over days).
    assert 5 < len(times) / (times[-1] - times[0]) < 60
    counts = {t: (trace.teams == t).mean() for t in set(trace.teams)}
    expected = team_weights(spec)
    assert counts["team-000"] == pytest.approx(expected[0], abs=0.02)
    assert pq.ParquetFile(path).metadata.num_row_groups == 5  # written in chunks
    assert path.stat().st_size < 3_000_000  # prompts dictionary-encoded, not repeated


def test_stream_replay_equals_in_memory_replay(synthetic: tuple) -> None:
    path, _ = synthetic
    sim = sim_config(threshold=0.2)
    trace = load_trace([path])
    scores = trace_scores(trace, sim.model_path)
    full = replay(sim, trace, scores)
    tot = stream_replay(sim, path, lambda t: score_texts(t, None), batch_rows=4_096)
    s = tot.summary()
    assert s["requests"] == len(trace)
    assert s["cost_usd"] == pytest.approx(full.cost_usd.sum(), rel=1e-9)
    assert s["quality"] == pytest.approx(full.quality.mean(), rel=1e-9)
    assert s["share"]["large"] == pytest.approx(full.summary()["share"]["large"])
    team_cost = {t: full.cost_usd[trace.teams == t].sum() for t in set(trace.teams)}
    for team, v in team_cost.items():
        assert s["team_cost_usd"][team] == pytest.approx(v, rel=1e-9)
    from simulations.replay import sweep_inputs, two_tier_policy

    ref = sweep(
        sweep_inputs(sim.prices, trace, scores, two_tier_policy(sim, None)), default_thresholds()
    )
    rows = tot.sweep_rows()
    np.testing.assert_allclose([r["cost_per_1k"] for r in rows], ref.cost_per_1k, rtol=1e-9)
    np.testing.assert_allclose([r["quality"] for r in rows], ref.quality, rtol=1e-9)


def test_synthetic_ids_drive_random_policies_in_both_replays(synthetic: tuple) -> None:
    path, spec = synthetic
    trace = load_trace([path])
    assert trace.ids is not None and trace.ids[:2] == [f"syn-{spec.seed}-0", f"syn-{spec.seed}-1"]
    sim = sim_config(policies={"coin": {"type": "random", "p": 0.3}})
    zeros = np.zeros(len(trace))  # a random policy ignores scores
    full = replay(sim, trace, zeros, "coin")
    tot = stream_replay(sim, path, lambda t: np.zeros(len(t)), "coin", batch_rows=4_096)
    assert tot.summary()["cost_usd"] == pytest.approx(full.cost_usd.sum(), rel=1e-9)
    assert tot.tier_counts.tolist() == np.bincount(full.tier_idx, minlength=2).tolist()


def test_parquet_bad_input(tmp_path: Path, synthetic: tuple) -> None:
    path, _ = synthetic
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["outcome_large"]), tmp_path / "missing.parquet")
    with pytest.raises(TraceError, match="missing column 'outcome_large'"):
        list(iter_batches(tmp_path / "missing.parquet"))
    times = table.column("time").to_numpy().copy()
    times[10] = times[0] - 1
    unsorted = table.set_column(table.schema.get_field_index("time"), "time", pa.array(times))
    pq.write_table(unsorted, tmp_path / "unsorted.parquet")
    with pytest.raises(TraceError, match="record 10: timestamps are not sorted"):
        list(iter_batches(tmp_path / "unsorted.parquet", batch_rows=4))
    pq.write_table(table.slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(TraceError, match="empty trace"):
        list(iter_batches(tmp_path / "empty.parquet"))
