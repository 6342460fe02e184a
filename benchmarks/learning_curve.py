"""Learning curve: how fast the retrain loop learns a domain the starting model never saw.

    .venv/bin/python benchmarks/learning_curve.py [--domain gsm8k|mmlu-half|both]
        [--steps 100,300,1000] [--seed 0] [--rounds 1000] [--test-share 0.4]

Domains, built from the shared RouteLLM data (classifiers.dataset.routellm_data_dir()):
- `gsm8k`: the starting model is trained on all of MMLU, the domain is GSM8K;
- `mmlu-half`: the MMLU subjects are split in two halves (seeded); the starting model is trained
  on GSM8K and one half, the domain is the other half's subjects.

The domain's labelled prompts are split (seeded) into a held-out test part (`--test-share`) and
a pool. The starting model is the shipped recipe (TrainConfig defaults) trained on everything
except the domain. At each step n the first n pool requests (a seeded order; the steps are
nested, as labels accumulate in a live folder) are the labelled traffic: the model is retrained
as `cost-router classifier train <traces> --with-default-data` does (classifiers.retrain
.train_model: own rows + the starting data, own weight 1, no out-of-fold report: the held-out
figures are computed here). n is capped at the pool's size (GSM8K has about 900 labelled rows,
so its pool holds about 540 and the 1,000 step runs at the whole pool; the table says so).

Labels: the `reference` judge (router/learning/judges/reference.py) marks each tier's answer
right or wrong against the request's known reference answer. The shared CSVs' per-model True/False
columns are that verdict, recorded by RouteLLM for each model's answer against the benchmark's
reference (GSM8K's final number, MMLU's letter); the CSVs carry no reference answers to re-judge
with, so the recorded outcomes are used as the reference judge's labels (no model is called).

Both models score the held-out test prompts through the ONNX runtime scorer the proxy uses
(classifiers.inference.DifficultyScorer); classifiers.compare.compare_models gives each one's
domain APGR with a 95% bootstrap interval and the paired 95% interval of the gain (new -
starting) on the same resamples, the promotion gate's rule ("gain above 0" = its low end > 0).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from classifiers.compare import Comparison, compare_models
from classifiers.dataset import RoutingDataset, concat, load_dataset, routellm_data_dir
from classifiers.inference import DifficultyScorer
from classifiers.labels import known
from classifiers.provenance import digests
from classifiers.retrain import TrainOptions, train_model
from classifiers.train import TrainConfig

DOMAINS = ("gsm8k", "mmlu-half")


@dataclass(frozen=True)
class Split:
    name: str
    base: RoutingDataset  # the starting model's training data (everything but the domain)
    pool: RoutingDataset  # domain requests the loop may label, in the order they arrive
    test: RoutingDataset  # held-out domain prompts the figures are about


def _labelled(ds: RoutingDataset) -> RoutingDataset:
    return ds.subset(known(ds.small, ds.large))


def _split(
    name: str, gsm8k: RoutingDataset, mmlu: RoutingDataset, seed: int, test_share: float
) -> Split:
    rng = np.random.default_rng(seed)
    if name == "gsm8k":
        domain, base = gsm8k, mmlu
    else:
        subjects = sorted(set(mmlu.source.tolist()))
        held = set(rng.permutation(subjects)[: len(subjects) // 2].tolist())
        in_domain = np.isin(mmlu.source, list(held))
        domain, base = mmlu.subset(in_domain), concat(gsm8k, mmlu.subset(~in_domain))
    order = rng.permutation(len(domain))
    n_test = int(round(test_share * len(domain)))
    test, pool = domain.subset(order[:n_test]), domain.subset(order[n_test:])
    # The figures must be out of sample: no test prompt may be trained on, from either side.
    test_digests = digests(test.prompts)
    base = base.subset(~np.isin(digests(base.prompts), test_digests))
    pool = pool.subset(~np.isin(digests(pool.prompts), test_digests))
    return Split(name, base, pool, test)


def _train(
    own: RoutingDataset, base: RoutingDataset | None, out: Path, options: TrainOptions
) -> DifficultyScorer:
    train_model(own, out, options, base=base)
    return DifficultyScorer.load(out)


def _row(n: str, c: Comparison) -> str:
    verdict = "yes" if c.better else "no"
    return f"| {n} | {c.current_apgr} | {c.new_apgr} | {c.delta} | {verdict} |"


def run(split: Split, steps: list[int], seed: int, rounds: int, tmp: Path) -> list[str]:
    options = TrainOptions(config=TrainConfig(seed=seed), folds=0, rounds=rounds)
    started = time.monotonic()

    def note(msg: str) -> None:
        print(f"  [{split.name} {time.monotonic() - started:5.0f} s] {msg}", flush=True)

    test_texts = split.test.prompts
    sm, lg = split.test.small, split.test.large
    note(
        f"base {len(split.base)} rows, pool {len(split.pool)}, test {len(split.test)}; "
        "training the starting model"
    )
    start = _train(split.base, None, tmp / f"{split.name}-start.onnx", options)
    current = start.score_texts(test_texts)
    lines = [
        f"{split.name}: starting model trained on {len(split.base)} rows without the domain; "
        f"domain pool {len(split.pool)}, held-out test {len(split.test)} prompts "
        f"(small right {np.mean(sm):.1%}, large {np.mean(lg):.1%})",
        "",
        "| labelled requests | starting APGR [95%] | retrained APGR [95%] "
        "| gain (paired) [95%] | gain > 0 |",
        "|---|---|---|---|---|",
    ]
    for n in steps:
        used = min(n, len(split.pool))
        label = str(n) if used == n else f"{n} (capped: {used}, the whole pool)"
        own = split.pool.subset(np.arange(used))
        note(f"retraining with {used} domain labels + the starting data")
        new = _train(own, split.base, tmp / f"{split.name}-{used}.onnx", options)
        comparison = compare_models(current, new.score_texts(test_texts), sm, lg, rounds, seed)
        lines.append(_row(label, comparison))
        note(lines[-1])
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--domain", choices=[*DOMAINS, "both"], default="both")
    parser.add_argument(
        "--steps", default="100,300,1000", help="labelled-request counts, comma-separated"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument(
        "--test-share",
        type=float,
        default=0.4,
        help="share of the domain's prompts held out for the figures",
    )
    args = parser.parse_args()
    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--steps: expected comma-separated integers, got {args.steps!r}")
    if not steps or min(steps) <= 0:
        parser.error(f"--steps: expected positive integers, got {args.steps!r}")
    if not 0 < args.test_share < 1:
        parser.error(f"--test-share: expected a share in (0, 1), got {args.test_share}")
    data = routellm_data_dir()
    gsm8k = _labelled(load_dataset([data / "gsm8k"]))
    mmlu = _labelled(load_dataset([data / "mmlu" / "responses"]))
    domains = DOMAINS if args.domain == "both" else (args.domain,)
    report: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in domains:
            split = _split(name, gsm8k, mmlu, args.seed, args.test_share)
            report += run(split, steps, args.seed, args.rounds, Path(tmp)) + [""]
    print(
        f"\nlearning curve (seed {args.seed}, {args.rounds} bootstrap rounds; APGR on "
        "held-out domain prompts, 95% intervals)\n"
    )
    print("\n".join(report))


if __name__ == "__main__":
    main()
