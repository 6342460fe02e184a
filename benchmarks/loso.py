"""Leave-one-source-out APGR per training recipe (classifiers/loso.py): which default travels.

    .venv/bin/python benchmarks/loso.py [--traces DIR ...] [--max-train-rows N] [--rounds 200]
        [--jobs 2] [--json out.json]

Holds out, in turn: GSM8K (trained on MMLU), MMLU (trained on GSM8K), half the MMLU subjects
(trained on the other half) both ways, and each trace folder given (its labelled requests:
labels and feedback merged in). For each recipe (the shipped one and the ones that leave out the
source prior, the character n-grams, the open-question weight, or both of the first two), prints
held-out APGR and AUC with 95% bootstrap intervals, the paired APGR difference from the shipped
recipe, the mean over holdouts, and the recipe chosen: the shipped one less every part whose
removal does not lower the mean. `cost-router classifier train DATA --report loso` prints the same
table for DATA. Full data: one fit per recipe and holdout (5 x 4 on up to ~9,800 rows each).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from classifiers.dataset import concat, load_dataset, routellm_data_dir
from classifiers.loso import RECIPES, loso_report
from classifiers.train import TrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--traces",
        type=Path,
        nargs="*",
        default=[],
        help="trace folders, each held out as a source of its own",
    )
    parser.add_argument(
        "--max-train-rows",
        type=int,
        default=None,
        help="fit each holdout on a seeded sample of at most this many rows",
    )
    parser.add_argument(
        "--max-rows-per-source",
        type=int,
        default=None,
        help="(smoke runs) keep at most this many rows of each file",
    )
    parser.add_argument("--rounds", type=int, default=200, help="bootstrap resamples")
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="worker processes (fits at once; the figures do not depend on it)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    data = routellm_data_dir()
    ds = load_dataset([data / "gsm8k", data / "mmlu" / "responses"], labelled_only=True)
    if args.traces:
        ds = concat(ds, load_dataset(args.traces, labelled_only=True))
    if args.max_rows_per_source:
        ds = ds.subset(_first_per_source(ds.source.tolist(), args.max_rows_per_source))
    recipes = {name: RECIPES[name] for name in RECIPES if name in args.recipes}
    started = time.monotonic()

    def progress(message: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {message}", file=sys.stderr, flush=True)

    report = loso_report(
        ds,
        TrainConfig(seed=args.seed),
        recipes,
        args.rounds,
        args.max_train_rows,
        progress,
        args.jobs,
    )
    print(f"{len(ds)} labelled rows from {len(set(ds.source.tolist()))} sources")
    for name in report.train_rows:
        print(f"  {name}: trained on {report.train_rows[name]}, held out {report.test_rows[name]}")
    print("\n".join(report.lines()))
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=2))


def _first_per_source(sources: list[str], n: int) -> list[int]:
    seen: dict[str, int] = {}
    out = []
    for i, source in enumerate(sources):
        if seen.get(source, 0) < n:
            seen[source] = seen.get(source, 0) + 1
            out.append(i)
    return out


if __name__ == "__main__":
    main()
