"""Routing quality by 5-fold cross-validation, per benchmark, next to LiteLLM's complexity router.

Our classifier: out-of-fold scores (classifiers.train.cross_val_scores: the shipped training
recipe, fitted on 4 folds, scoring the 5th; folds stratified by benchmark, seeded). The source
prior's per-source mean gains and its cross-fitting use the 4 training folds only. LiteLLM's
rule-based complexity router (`litellm.router_strategy.complexity_router`, heuristic scorer) needs
no training: its weighted score is computed offline for the same prompts, so both routers are
measured on exactly the same rows. Contaminated prompts are excluded as RouteLLM does.

    .venv/bin/python benchmarks/classifier_quality.py [--data DIR] [--folds 5] [--seed 0]
        [--prior-weight 0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from classifiers.dataset import load_dataset, routellm_data_dir  # noqa: E402
from classifiers.evaluate import METRICS, bootstrap  # noqa: E402
from classifiers.train import TrainConfig, cross_val_scores, with_overrides  # noqa: E402


def litellm_scores(prompts: list[str]) -> np.ndarray:
    """LiteLLM's heuristic complexity score for each prompt (no proxy, no network)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from litellm.router_strategy.complexity_router.complexity_router import ComplexityRouter

    router = ComplexityRouter(model_name="complexity-router", litellm_router_instance=None)
    return np.array([router.classify(p)[1] for p in prompts], dtype=np.float64)


def print_calibration(scores: np.ndarray, small: np.ndarray, large: np.ndarray) -> None:
    """Our score is (1 + expected gain) / 2: compare predicted and observed gain per decile."""
    print("\ncalibration (out-of-fold, pooled): score decile, predicted gain, observed gain")
    order = np.argsort(scores, kind="stable")
    for k, part in enumerate(np.array_split(order, 10)):
        predicted = float((2 * scores[part] - 1).mean())
        observed = float((large[part] - small[part]).mean())
        print(f"  decile {k + 1:2d}: predicted {predicted:+.3f}  observed {observed:+.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(routellm_data_dir()))
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--prior-weight",
        type=float,
        default=None,
        help="override TrainConfig.prior_weight (0: no source prior, the previous recipe)",
    )
    args = parser.parse_args()

    dataset = load_dataset(args.data)
    config = with_overrides(TrainConfig(seed=args.seed), prior_weight=args.prior_weight)
    start = time.perf_counter()
    rows, ours = cross_val_scores(dataset, config, args.folds, lambda m: print(m, flush=True))
    cv_s = time.perf_counter() - start
    theirs = litellm_scores([dataset.prompts[i] for i in rows])
    random = np.random.default_rng(args.seed + 1).random(len(rows))
    small, large = dataset.small[rows], dataset.large[rows]
    bench = dataset.benchmark[rows].astype(str)

    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    header = f"{'benchmark':10s} {'router':22s} " + " ".join(f"{m:>24s}" for m in METRICS)
    print(f"\n{args.folds}-fold CV, out-of-fold scores, 95% bootstrap CI ({args.rounds} rounds)")
    print(header)
    for name in [*sorted(set(bench)), "all"]:
        m = np.ones(len(rows), bool) if name == "all" else bench == name
        results[name] = {}
        for router, scores in (("ours", ours), ("litellm-complexity", theirs), ("random", random)):
            cells = []
            results[name][router] = {}
            for metric, fn in METRICS.items():
                est = bootstrap(fn, scores[m], small[m], large[m], args.rounds, args.seed)
                results[name][router][metric] = [est.value, est.low, est.high]
                cells.append(f"{str(est):>24s}")
            print(f"{name:10s} {router:22s} " + " ".join(cells))
    print_calibration(ours, small, large)
    print(
        f"\nrows: {len(rows)} (contaminated excluded: {dataset.excluded_contaminated}); "
        f"config: {config.as_dict()}; CV time {cv_s:.0f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
