"""The source prior's cross-fitting settings side by side (issue 25, item 7): fit time and
held-out APGR of the current default (3 folds, tolerance 1e-3) and the former one (5 folds,
scikit-learn's 1e-4), each trained on the same seeded three quarters of the shipped data and
scored on the quarter left out (stratified by source).

    .venv/bin/python benchmarks/source_prior_settings.py [--data DIR] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from classifiers.dataset import load_dataset, routellm_data_dir  # noqa: E402
from classifiers.evaluate import apgr  # noqa: E402
from classifiers.train import TrainConfig, fit_frame, frame, predict_scores, training_rows  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(routellm_data_dir()))
    parser.add_argument("--seed", type=int, default=1, help="the held-out quarter's seed")
    args = parser.parse_args()
    dataset = load_dataset(args.data)
    rows, labels = training_rows(dataset, 0.0)
    sources = np.asarray(dataset.source[rows]).astype(str)
    train, test = train_test_split(
        np.arange(len(rows)), test_size=0.25, random_state=args.seed, stratify=sources
    )
    data = frame([dataset.prompts[i] for i in rows])
    held = rows[test]
    settings = {
        "current (3 folds, tol 1e-3)": TrainConfig(),
        "former (5 folds, tol 1e-4)": replace(TrainConfig(), prior_folds=5, prior_tol=1e-4),
    }
    for name, config in settings.items():
        t0 = time.perf_counter()
        pipeline = fit_frame(data.iloc[train], labels[train], config, sources[train])
        seconds = time.perf_counter() - t0
        scores = predict_scores(pipeline, data.iloc[test])
        value = apgr(scores, dataset.small[held], dataset.large[held])
        print(f"{name}: fit {seconds:.0f} s, held-out APGR {value:.4f} ({len(test)} prompts)")


if __name__ == "__main__":
    main()
