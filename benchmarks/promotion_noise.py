"""Does the promotion gate promote a model trained on noise? Real prompts, the real pipeline.

    .venv/bin/python benchmarks/promotion_noise.py [--seeds 40] [--rows 300] [--rounds 200]

Per seed: ROWS labelled prompts drawn (seeded) from the shared RouteLLM data (GSM8K and MMLU),
their outcome pairs shuffled across prompts, and a model trained on them the way `classifier
train` trains (classifiers.train.out_of_fold, 5 folds, the shipped recipe), scored out of fold.
The gate (simulations.promotion.gate, what `classifier promote` runs) then compares it, on the
true outcomes, with (a) the shipped model (in-sample on this data: an easy refusal) and (b) a
router that knows nothing (uniform random scores: the hard case, where only the interval's
calibration stands between noise and a promotion). Prints the refusal rate of each. The fast,
synthetic version is tests/simulations/test_promotion_gate.py.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from classifiers.dataset import concat, load_dataset, routellm_data_dir
from classifiers.inference import DifficultyScorer
from classifiers.labels import known
from classifiers.train import TrainConfig, out_of_fold
from simulations.promotion import gate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    data = routellm_data_dir()
    pool = concat(load_dataset([data / "gsm8k"]),
                  load_dataset([data / "mmlu" / "responses"]))  # fmt: skip
    pool = pool.subset(known(pool.small, pool.large))
    shipped = DifficultyScorer.load(None)
    refused = {"shipped": 0, "random": 0}
    started = time.monotonic()
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        ds = pool.subset(rng.choice(len(pool), args.rows, replace=False))
        small, large = ds.small.copy(), ds.large.copy()
        order = rng.permutation(args.rows)  # outcome pairs to other prompts: labels are noise
        noisy = ds.subset(np.arange(args.rows))
        noisy.small[:], noisy.large[:] = small[order], large[order]
        oof = out_of_fold(noisy, TrainConfig(seed=seed), None, 5)
        new = oof.scores
        sm, lg = small[oof.rows], large[oof.rows]
        current = {
            "shipped": shipped.score_texts([ds.prompts[i] for i in oof.rows]),
            "random": rng.random(len(oof.rows)),
        }
        for name, scores in current.items():
            verdict = gate(scores, new, sm, lg, args.rounds, seed)
            refused[name] += not verdict.promote
        print(f"seed {seed}: {verdict.reason()}  ({time.monotonic() - started:.0f} s)", flush=True)
    for name, count in refused.items():
        print(f"refused against the {name} model: {count} of {args.seeds} "
              f"({count / args.seeds:.0%})")  # fmt: skip


if __name__ == "__main__":
    main()
