"""Out-of-fold training on live traffic (issue 13): a prompt repeated in the traffic stays in one
fold. `cost-router classifier train` on any traffic is tested with the commands
(tests/router/commands/test_classifier_train_cli.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from classifiers.dataset import load_dataset, routellm_data_dir

DATA = routellm_data_dir()


def test_repeated_prompts_share_a_fold() -> None:
    # Live traffic repeats prompts; a repeat in the training folds would make a score in-sample.
    from classifiers.train import TrainConfig, out_of_fold

    ds = load_dataset(DATA / "gsm8k").subset(np.arange(150))
    repeated = ds.subset(np.concatenate([np.arange(150), np.arange(40)]))
    repeated = replace(
        repeated,
        prompts=repeated.prompts[:150] + [p.upper() + "  " for p in repeated.prompts[150:]],
    )
    oof = out_of_fold(repeated, TrainConfig(), folds=3)
    fold_of = dict(zip(oof.rows.tolist(), oof.folds.tolist(), strict=True))
    assert all(fold_of[i] == fold_of[150 + i] for i in range(40))
