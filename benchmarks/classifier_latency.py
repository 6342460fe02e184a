"""Classifier speed: one query at a time (p50/p99), batch throughput, model size, RSS added by load.

onnxruntime runs with intra/inter-op threads = 1; single-query timing covers the whole
`score_texts([prompt])` call (Python preprocessing + graph) after a warm-up. Batch throughput is
given for one thread and overlapped (preprocessing of the next chunk while onnxruntime scores the
current one, two threads); see classifiers/bench.py.

    .venv/bin/python benchmarks/classifier_latency.py [--model PATH] [--queries 5000] [--batch 8000]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from classifiers.bench import run_bench  # noqa: E402
from classifiers.dataset import routellm_data_dir  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(routellm_data_dir()))
    parser.add_argument("--model", default=None)
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=8000)
    args = parser.parse_args()
    figures = run_bench(Path(args.data), args.model, args.queries, args.batch)
    load = os.getloadavg()
    print(f"{'figure':24s} value")
    for key, value in figures.items():
        print(f"{key:24s} {value}")
    print(f"{'load average (1/5/15 m)':24s} {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
