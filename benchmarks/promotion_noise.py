"""Does the promotion gate promote a model trained on noise? Real prompts, the real pipeline.

    .venv/bin/python benchmarks/promotion_noise.py [--seeds 40] [--rows 300] [--rounds 200]
        [--folds 3] [--jobs 2] [--recipe shipped] [--json out.json]

Per seed: ROWS labelled prompts drawn (seeded) from the shared RouteLLM data (GSM8K and MMLU),
their outcome pairs shuffled across prompts, and a model trained on them the way `classifier
train` trains (classifiers.train.out_of_fold, the shipped recipe, FOLDS folds), scored out of
fold. The gate (simulations.promotion.gate, what `classifier promote` runs) then compares it, on
the true outcomes, with (a) the shipped model (in-sample on this data: an easy refusal) and (b) a
router that knows nothing (uniform random scores: the hard case, where only the interval's
calibration stands between noise and a promotion). Prints the refusal rate of each, with its
exact (Clopper-Pearson) 95% interval. The fast, synthetic version is
tests/simulations/test_promotion_gate.py.

Cost: what is the same for every seed is done once. The pool is loaded and its model inputs
(classifiers.features, the text blocks every fit reads) and the shipped model's scores are
computed once, before the seeds; each seed then only fits. Seeds run in `--jobs` worker
processes (forked after the preparation, so they share it); 3 folds instead of `train`'s 5 fit
40% less and leave the gate's question (is noise refused) the same. What is left is fitting,
and ~90% of that is the shipped recipe's source prior (a logistic regression over the ~58
sources a 300-row sample holds, cross-fitted: classifiers/train.py SourcePrior), which no cache
can share (its inputs depend on each fold's vocabulary). `--recipe` (classifiers/loso.py
RECIPES) trains another recipe instead: `no_source_prior` fits about 10x faster; the gate
question is the same for any recipe, the figure is then for that recipe.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import beta

from classifiers.dataset import RoutingDataset, concat, load_dataset, routellm_data_dir
from classifiers.forked import forked_map, shared
from classifiers.inference import DifficultyScorer
from classifiers.labels import known
from classifiers.loso import RECIPES, recipe_config
from classifiers.train import TrainConfig, frame, out_of_fold
from simulations.promotion import gate


@dataclass(frozen=True)
class Pool:
    dataset: RoutingDataset
    inputs: pd.DataFrame  # frame(dataset.prompts)
    shipped: np.ndarray  # the shipped model's score per pool row


def prepare(max_pool: int | None = None) -> Pool:
    data = routellm_data_dir()
    pool = concat(load_dataset([data / "gsm8k"]), load_dataset([data / "mmlu" / "responses"]))
    pool = pool.subset(known(pool.small, pool.large))
    if max_pool is not None and len(pool) > max_pool:
        pool = pool.subset(np.sort(np.random.default_rng(0).choice(len(pool), max_pool, False)))
    shipped = DifficultyScorer.load(None).score_texts(pool.prompts)
    return Pool(pool, frame(pool.prompts), np.asarray(shipped, np.float64))


def one_seed(
    seed: int, rows: int, rounds: int, folds: int, without: tuple[str, ...] = ()
) -> dict[str, object]:
    pool: Pool = shared()  # prepare()'s, set before the workers fork; none writes it
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(pool.dataset), rows, replace=False)
    ds = pool.dataset.subset(pick)
    small, large = ds.small.copy(), ds.large.copy()
    order = rng.permutation(rows)  # outcome pairs to other prompts: labels are noise
    noisy = ds.subset(np.arange(rows))
    noisy.small[:], noisy.large[:] = small[order], large[order]
    inputs = pool.inputs.iloc[pick].reset_index(drop=True)
    config = recipe_config(TrainConfig(seed=seed), without)
    oof = out_of_fold(noisy, config, None, folds, inputs=inputs)
    sm, lg = small[oof.rows], large[oof.rows]
    current = {"shipped": pool.shipped[pick][oof.rows], "random": rng.random(len(oof.rows))}
    verdicts = {
        name: gate(scores, oof.scores, sm, lg, rounds, seed) for name, scores in current.items()
    }
    return {
        "seed": seed,
        **{f"{name}_refused": not v.promote for name, v in verdicts.items()},
        "random_reason": verdicts["random"].reason(),
    }


def exact_interval(k: int, n: int) -> tuple[float, float]:
    low = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return low, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (seeds at once)")
    parser.add_argument(
        "--recipe",
        default="shipped",
        choices=list(RECIPES),
        help="the training recipe of the noise models (classifiers/loso.py)",
    )
    parser.add_argument(
        "--max-pool",
        type=int,
        default=None,
        help="(smoke runs) draw from a seeded sample of this many pool rows",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started = time.monotonic()
    prepared = prepare(args.max_pool)
    print(
        f"prepared {len(prepared.dataset)} pool rows in {time.monotonic() - started:.0f} s",
        flush=True,
    )
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    results = []
    fit = partial(
        one_seed, rows=args.rows, rounds=args.rounds, folds=args.folds, without=RECIPES[args.recipe]
    )
    for result in forked_map(fit, seeds, prepared, args.jobs):
        results.append(result)
        print(
            f"seed {result['seed']}: {result['random_reason']}  "
            f"({time.monotonic() - started:.0f} s)",
            flush=True,
        )
    summary = {}
    for name in ("shipped", "random"):
        count = sum(bool(r[f"{name}_refused"]) for r in results)
        low, high = exact_interval(count, len(results))
        summary[name] = {"refused": count, "seeds": len(results), "low": low, "high": high}
        print(
            f"refused against the {name} model: {count} of {len(results)} "
            f"({count / len(results):.0%}, exact 95% interval [{low:.0%}, {high:.0%}])"
        )
    print(f"total {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "summary": summary,
                    "seeds": results,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
