"""Benchmark: sweep a 1,000,000-request synthetic trace over 201 thresholds (target <= 5 s).

Steps: synthesise the trace from the shared RouteLLM prompts (Parquet), read it, score it with the
shipped classifier (each distinct prompt once), then time the part the target is about: per-request
costs for both tiers + the vectorised sweep (+ Pareto front and APGR). For scale, the same 201
points computed the naive way (the policy's decide_batch and masked means per threshold), and a
full `tune` (1000-resample bootstrap), are timed in the same run.

    .venv/bin/python benchmarks/sim_sweep.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from classifiers.dataset import routellm_data_dir
from classifiers.evaluate import apgr
from policies.threshold import ThresholdPolicy
from simulations.parquet_io import read_parquet
from simulations.replay import sweep_inputs, trace_scores, two_tier_policy
from simulations.sim_config import default_sim_config
from simulations.sweep import default_thresholds, pareto_front, sweep
from simulations.synth import SynthSpec, pool_from_trace, write_synthetic
from simulations.trace_loader import load_trace
from simulations.tune import Target, tune

DATA = routellm_data_dir()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args()
    config = default_sim_config()
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.parquet"
        t = time.perf_counter()
        pool = pool_from_trace(load_trace([DATA], default_completion_tokens=1))
        write_synthetic(pool, SynthSpec(rows=args.rows, seed=0), path)
        rows.append(("synthesise (Parquet)", f"{time.perf_counter() - t:.2f} s"))
        t = time.perf_counter()
        trace = read_parquet([path])
        rows.append(("read Parquet into memory", f"{time.perf_counter() - t:.2f} s"))
    t = time.perf_counter()
    scores = trace_scores(trace, config.model_path)
    rows.append(("score (distinct prompts once)", f"{time.perf_counter() - t:.2f} s"))

    th = default_thresholds(201)
    t = time.perf_counter()
    inputs = sweep_inputs(config.prices, trace, scores, two_tier_policy(config, None))
    result = sweep(inputs, th)
    front = pareto_front(result.cost_per_1k, result.quality)
    a = apgr(scores, inputs.quality_small, inputs.quality_large)
    sweep_s = time.perf_counter() - t
    rows.append(("SWEEP 201 thresholds (costs + sweep + Pareto + APGR)", f"{sweep_s:.2f} s"))

    t = time.perf_counter()
    naive_q = []
    for x in th:
        large = ThresholdPolicy("p", "small", "large", float(x)).decide_batch(scores) == 1
        naive_q.append(np.where(large, inputs.quality_large, inputs.quality_small).mean())
        np.where(large, inputs.cost_large, inputs.cost_small).mean()
    naive_s = time.perf_counter() - t
    assert np.allclose(naive_q, result.quality)
    rows.append(("naive: decide_batch + masked means per threshold", f"{naive_s:.2f} s"))

    t = time.perf_counter()
    tuned = tune(inputs, Target("quality", 0.95), default_thresholds(1001), resamples=1000)
    rows.append(
        (
            "tune: 1001 thresholds + 1000 resamples (moment-matched)",
            f"{time.perf_counter() - t:.2f} s",
        )
    )

    print(
        f"requests {len(trace):,}; {len(front)} Pareto points; APGR {a:.3f}; "
        f"95%-quality threshold {tuned.threshold:.3f} "
        f"[{tuned.intervals['threshold'].low:.3f}, {tuned.intervals['threshold'].high:.3f}]"
    )
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    print(
        f"sweep speed-up over naive: {naive_s / sweep_s:.1f}x; target <= 5 s: "
        f"{'met' if sweep_s <= 5 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
