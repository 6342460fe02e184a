"""Train a model on labelled traffic and say whether it beats the current one: what
`cost-router classifier train` runs (offline only: scikit-learn, onnx, onnxruntime).

    report = train_model(own, Path("new.onnx"), TrainOptions(), base=shipped_data)

writes, beside each other,
- `new.onnx` + `new.json`: the model and its metadata (classifiers/export.py), with the
  out-of-fold comparison under `out_of_fold`;
- `new.prompts`: the training prompts' hashes (classifiers/provenance.py), so `eval`, `tune` and
  `simulate` can tell in-sample data by content;
- `new.oof.jsonl`: one line per labelled request of `own`, {"request_id", "score" (the new model,
  out of fold), "fold", "current_score"}, so `tune --scores new.oof.jsonl` picks a threshold out
  of sample and a promotion gate can re-run `compare_models` without refitting;
- `new.scores.json`: the reference score distribution of those out-of-fold scores
  (classifiers/score_reference.py), which the live drift gauges compare with once the model is
  promoted (scores of prompts the model did not fit, as live traffic will be).

`own` is the data the figures are about (a trace folder's labelled requests, or any data given to
`train`); `base` (optional, the shipped training data) is added to every fit and never scored,
with `own` rows weighted `own_weight` against base rows' 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.compare import Comparison, compare_models
from classifiers.dataset import RoutingDataset, concat
from classifiers.export import export, metadata_for
from classifiers.inference import DifficultyScorer
from classifiers.labels import known
from classifiers.model_files import ModelFiles
from classifiers.oof import write_oof
from classifiers.provenance import HASH_NAME, digests, in_sample_note, write_prompts
from classifiers.score_reference import ScoreReference
from classifiers.train import OutOfFold, TrainConfig, fit, out_of_fold

# Below this many labelled requests the report warns that its figures are uncertain, and so does
# an out-of-fold APGR interval wider than WIDE_INTERVAL (measured: about 0.10 at 1,000 GSM8K
# prompts, 0.2+ at a few hundred).
FEW_ROWS = 1000
WIDE_INTERVAL = 0.10

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TrainOptions:
    config: TrainConfig = field(default_factory=TrainConfig)
    own_weight: float = 1.0  # weight of an `own` row against a `base` row's 1
    folds: int = 5  # out-of-fold report over `own` (0: no report, no .oof.jsonl)
    rounds: int = 1000  # bootstrap resamples of the comparison
    current_model: Path | None = None  # the model compared against; None: the shipped one
    jobs: int = 1  # out-of-fold fits at once (forked workers; the figures do not depend on it)


@dataclass(frozen=True)
class TrainReport:
    model: Path
    metadata: dict[str, Any]
    labelled: int  # labelled rows of `own`
    base_rows: int  # labelled rows of `base` added to the fit
    oof: OutOfFold | None
    oof_file: Path | None
    comparison: Comparison | None
    warnings: list[str]


def train_model(
    own: RoutingDataset,
    out: Path,
    options: TrainOptions,
    base: RoutingDataset | None = None,
    data: list[Path] | None = None,
    progress: Progress | None = None,
) -> TrainReport:
    """Fit on `own` (+ `base`), export to `out`, and compare with the current model out of fold.

    Raises ValueError for data that cannot train a model (no labelled rows where the two
    outcomes differ, weights <= 0).
    """
    step = progress or (lambda _msg: None)
    if options.own_weight <= 0:
        raise ValueError(f"own weight must be > 0, got {options.own_weight}")
    labelled = known(own.small, own.large)
    n_own = int(labelled.sum())
    if n_own == 0:
        raise ValueError(_no_labels(own))
    dataset, weights, base_rows = own, None, 0
    warnings: list[str] = []
    if base is not None:
        # A base row with one of own's prompts would put that prompt in every fold's training
        # set: its out-of-fold score would be in-sample. Such rows are left out of base.
        shared = np.isin(digests(base.prompts), digests(own.prompts))
        if shared.any():
            base = base.subset(~shared)
            warnings.append(
                f"note: left out {int(shared.sum())} rows of the default data whose prompts are "
                "in DATA (kept once, as DATA rows)"
            )
        base_rows = int(known(base.small, base.large).sum())
        dataset = concat(own, base)
        weights = np.concatenate([np.full(len(own), options.own_weight), np.ones(len(base))])
    evaluated = np.zeros(len(dataset), bool)
    evaluated[: len(own)] = True
    oof, comparison, current = None, None, np.zeros(0)
    current_path = options.current_model
    if options.folds:
        if n_own < 2 * options.folds:
            warnings.append(
                f"warning: {n_own} labelled requests are too few for a {options.folds}-fold "
                "out-of-fold report; none written"
            )
        else:
            oof = out_of_fold(
                dataset,
                options.config,
                evaluated,
                options.folds,
                weights,
                step,
                jobs=options.jobs,
                with_final=options.jobs > 1,  # the final fit shares the workers with the folds
            )
            step("scoring with the current model")
            scorer = DifficultyScorer.load(current_path)
            current_path = scorer.path
            texts = [dataset.prompts[i] for i in oof.rows]
            current = scorer.score_texts(texts)
            comparison = compare_models(
                current,
                oof.scores,
                dataset.small[oof.rows],
                dataset.large[oof.rows],
                options.rounds,
                options.config.seed,
            )
            if note := in_sample_note(scorer.path, texts, "the current model's figures"):
                warnings.append(note)
    warnings += _uncertainty(n_own, comparison)
    step("fitting the model")
    pipeline = oof.final if oof is not None and oof.final is not None else None
    if pipeline is None:
        pipeline = fit(dataset, options.config, step, weights)
    step("exporting to ONNX")
    trained = known(dataset.small, dataset.large)
    meta = metadata_for(dataset, options.config, pipeline, list(data or []))
    meta.update(
        own_rows=n_own,
        base_rows=base_rows,
        own_weight=options.own_weight,
        training_prompts={
            "file": ModelFiles(out).prompts.name,
            "count": int(trained.sum()),
            "hash": HASH_NAME,
        },
    )
    oof_file = None
    if oof is not None and comparison is not None:
        oof_file = ModelFiles(out).oof
        meta["out_of_fold"] = {
            "file": oof_file.name,
            "folds": options.folds,
            "current_model": str(current_path),
            "comparison": comparison.as_dict(),
        }
    meta = export(pipeline, out, meta)
    write_prompts(out, [dataset.prompts[i] for i in np.flatnonzero(trained)])
    if oof is not None and oof_file is not None:
        ids = [dataset.ids[i] for i in oof.rows]
        write_oof(oof_file, ids, oof.scores.tolist(), oof.folds.tolist(), current.tolist())
        ScoreReference.from_scores(oof.scores, source=oof_file.name, model=out.name).save(
            ModelFiles(out).scores
        )
    return TrainReport(out, meta, n_own, base_rows, oof, oof_file, comparison, warnings)


def _no_labels(own: RoutingDataset) -> str:
    parts = [f"no labelled requests: none of {len(own)} rows has both outcomes"]
    if own.unlabelled:
        parts.append(f"{own.unlabelled} requests have no label yet")
    if own.without_text:
        parts.append(
            f"{own.without_text} labelled requests have no prompt in the trace "
            "(turn on prompt logging for the teams whose traffic you train on)"
        )
    return "; ".join(parts)


def _uncertainty(n: int, comparison: Comparison | None) -> list[str]:
    width = None if comparison is None else comparison.new_apgr.high - comparison.new_apgr.low
    if n >= FEW_ROWS and (width is None or not width > WIDE_INTERVAL):
        return []
    if width is None or np.isnan(width):
        return [
            f"warning: only {n} labelled requests: the model's quality is uncertain (no "
            "out-of-fold interval to say how much); label more traffic before relying on it"
        ]
    return [
        f"warning: only {n} labelled requests: the new model's out-of-fold APGR "
        f"{comparison.new_apgr} is {width:.2f} wide (95%); label more traffic before relying "
        "on small differences"
    ]
