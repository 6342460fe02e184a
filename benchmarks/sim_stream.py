"""Benchmark: replay a 10,000,000-request Parquet trace streaming, peak memory <= 2 GB.

Synthesises the trace (real shared prompts, Poisson arrivals, Zipf teams), then runs the real
command `cost-router simulate --stream` on it in a child process and reads that child's peak RSS
(getrusage RUSAGE_CHILDREN ru_maxrss), so the generator's own memory is not counted.

    .venv/bin/python benchmarks/sim_stream.py [--rows 10000000] [--keep FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from classifiers.dataset import routellm_data_dir
from simulations.synth import SynthSpec, pool_from_trace, write_synthetic
from simulations.trace_loader import load_trace

DATA = routellm_data_dir()
CLI = Path(sys.executable).with_name("cost-router")


def router_config(threshold: float) -> dict[str, object]:
    """A router config at the simulator's default prices (tier addresses are never called)."""

    def tier(name: str, price: tuple[float, float]) -> dict[str, object]:
        return {
            "name": name,
            "base_url": f"http://{name}.invalid/v1",
            "model": name,
            "price": {"input_per_mtok": price[0], "output_per_mtok": price[1]},
        }

    return {
        "tiers": [tier("small", (0.6, 0.6)), tier("large", (10.0, 30.0))],
        "policies": {"balanced": {"type": "threshold", "threshold": threshold}},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--batch-rows", type=int, default=262_144)
    ap.add_argument("--threshold", type=float, default=0.2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "synthetic.parquet"
        t = time.perf_counter()
        pool = pool_from_trace(load_trace([DATA], default_completion_tokens=1))
        write_synthetic(pool, SynthSpec(rows=args.rows, seed=1), path)
        synth_s = time.perf_counter() - t
        size_mb = path.stat().st_size / 1e6
        out = Path(tmp) / "result.json"
        config = Path(tmp) / "router.yaml"
        config.write_text(yaml.safe_dump(router_config(args.threshold)))
        t = time.perf_counter()
        subprocess.run(
            [
                str(CLI),
                "simulate",
                "--traces",
                str(path),
                "--config",
                str(config),
                "--stream",
                "--batch-rows",
                str(args.batch_rows),
                "--json",
                str(out),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        replay_s = time.perf_counter() - t
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
        summary = json.loads(out.read_text())["summary"]
    print(f"rows {summary['requests']:,}  file {size_mb:.0f} MB  synthesis {synth_s:.1f} s")
    print(
        f"streamed replay (score + decide + cost + per-team spend + 201-point sweep): "
        f"{replay_s:.1f} s, {summary['requests'] / replay_s:,.0f} requests/s"
    )
    print(
        f"peak RSS of the replay process: {peak_mb:,.0f} MiB (target <= 2048 MiB: "
        f"{'met' if peak_mb <= 2048 else 'NOT met'})"
    )
    print(
        f"large share {summary['share']['large']:.3f}, cost/1k ${summary['cost_per_1k']:.4f}, "
        f"quality {summary['quality']:.4f}"
    )


if __name__ == "__main__":
    main()
