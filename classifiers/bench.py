"""Classifier speed figures (used by `cost-router classifier bench` and benchmarks/).

Single-query latency is the full `score_texts([prompt])` call (Python preprocessing + onnxruntime,
one thread) after a warm-up, over real prompts in a fixed shuffled order. Batch throughput is one
`score_texts` call over `batch` prompts (median of 3), once with preprocessing and onnxruntime
taking turns on one thread and once overlapped (onnxruntime in a helper thread: two cores).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from classifiers.dataset import load_dataset
from classifiers.inference import DifficultyScorer


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_bench(
    data: Path, model: Path | None, queries: int = 2000, batch: int = 4000, seed: int = 0
) -> dict[str, float | int | str]:
    prompts = load_dataset(data, require_outcomes=False).prompts
    if not prompts:
        raise ValueError(f"{data}: no prompts")
    order = np.random.default_rng(seed).permutation(len(prompts))
    before = rss_bytes()
    scorer = DifficultyScorer.load(model)
    added = rss_bytes() - before
    for i in order[:200]:
        scorer.score_texts([prompts[i]])
    timings = np.empty(queries)
    for k in range(queries):
        text = prompts[order[k % len(order)]]
        start = time.perf_counter()
        scorer.score_texts([text])
        timings[k] = time.perf_counter() - start
    batch_prompts = [prompts[order[k % len(order)]] for k in range(batch)]
    scorer.score_texts(batch_prompts[:512])
    rates = {}
    for overlap in (False, True):
        # Median of three: the machine is shared and one run can be slowed by a neighbour.
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            scorer.score_texts(batch_prompts, overlap=overlap)
            runs.append(batch / (time.perf_counter() - start))
        rates[overlap] = round(float(np.median(runs)))
    path = scorer.path
    return {
        "model": str(path),
        "model_bytes": path.stat().st_size,
        "rss_added_by_load_mb": round(added / 2**20, 1),
        "single_queries": queries,
        "p50_ms": round(float(np.percentile(timings, 50)) * 1e3, 4),
        "p99_ms": round(float(np.percentile(timings, 99)) * 1e3, 4),
        "mean_ms": round(float(timings.mean()) * 1e3, 4),
        "batch_prompts": batch,
        # One thread: preprocessing and onnxruntime take turns.
        "batch_prompts_per_s": rates[False],
        # Python prepares the next chunk while onnxruntime scores this one (two threads).
        "batch_overlapped_per_s": rates[True],
    }
