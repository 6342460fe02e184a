"""Fit the difficulty classifier. Offline only (imports scikit-learn and pandas).

Model: TF-IDF word and character n-grams + numeric features, kept separately for multiple-choice
and open questions (see classifiers.features.model_inputs), -> one multinomial logistic
regression over the outcome classes {large worse, tie, large better}. The score is the expected
gain of the large model, P(better) - P(worse), mapped to [0, 1]: (1 + gain) / 2. The ranking
matters for routing and it uses both ways a prompt can go, which a binary "large beats small"
label throws away (labels.py).

Speed: onnxruntime builds a dense [rows, vocabulary] matrix, so fitting is two-stage: a first fit
on a large vocabulary ranks n-grams by weight, and the final model keeps only the strongest ones
as a fixed vocabulary.

Source prior (stacking, `SourcePrior`): how much the large model helps depends a lot on the topic
(the MMLU subject's mean gain alone ranks MMLU prompts better than the text model), but the topic
is only known at training time (the file a row came from). A second multinomial logistic
regression predicts the source from the numeric features and the multiple-choice n-grams; its
probabilities @ the sources' mean gain (training rows only) are one more input of the final
model. The training rows get that input cross-fitted (out of fold), so the final model weighs it
as it behaves on unseen prompts. In 5-fold CV it raised MMLU APGR from 0.671 to 0.690
(docs/benchmarks.md, Classifier).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import sparse
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.compose import ColumnTransformer
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from classifiers.dataset import RoutingDataset
from classifiers.features import NUMERIC_INPUTS, WORD_PATTERN, model_inputs
from classifiers.forked import forked_map, shared
from classifiers.labels import gain_class, known

CLASS_VALUES = {-1: 0.0, 0: 0.5, 1: 1.0}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the model; saved in the metadata so a model can be rebuilt."""

    seed: int = 0
    margin: float = 0.0
    C: float = 0.1
    char_ngrams: tuple[int, int] = (3, 5)
    # First-stage vocabulary per vectorizer, and n-grams kept in the final model.
    candidate_features: int = 20000
    keep_word: int = 3000
    keep_char: int = 3000
    # Character n-grams cost the most time in onnxruntime; they can be limited to some sides.
    char_sides: tuple[str, ...] = ("mc", "open")
    # Feature scale of the open-question side: weight w acts like C * w**2 for those weights
    # (open questions are few and like weaker regularization than multiple-choice ones).
    open_weight: float = 1.73
    # Source prior (see the module docstring): scale of its standardized input to the final model
    # (0: off), C of the source classifier, the feature blocks it reads (placed first in the
    # feature matrix, so that it reads one column range), cross-fitting folds, and the solver's
    # tolerance: the source classifier over 57 MMLU subjects is most of a fit's time (5 folds at
    # scikit-learn's 1e-4 made `--with-default-data` ~8 min on 2 cores); 3 folds at 1e-3 cost
    # about a third of that and score the same on held-out rows (docs/learning.md).
    prior_weight: float = 1.0
    prior_C: float = 3.0
    prior_blocks: tuple[str, ...] = ("num", "mc_word", "mc_char")
    prior_folds: int = 3
    prior_tol: float = 1e-3

    def __post_init__(self) -> None:
        # Configs read back from model.json have lists where tuples belong.
        for name in ("char_ngrams", "char_sides", "prior_blocks"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def frame(prompts: list[str]) -> pd.DataFrame:
    return pd.DataFrame(model_inputs(prompts))


def present_blocks(data: pd.DataFrame, config: TrainConfig) -> frozenset[str]:
    """The text blocks (`mc_word`, `open_char`, ...) the data can fit: a vectorizer over a side
    with no usable text (open-ended traffic has no multiple-choice prompts, GSM8K alone neither)
    would stop scikit-learn with "empty vocabulary"; such a block is left out of the model."""
    words = re.compile(WORD_PATTERN)
    shortest = config.char_ngrams[0]
    out = set()
    for side in ("mc", "open"):
        texts = data[f"{side}_text"]
        if any(words.search(t) for t in texts):
            out.add(f"{side}_word")
        if any(len(t) >= shortest for t in texts):
            out.add(f"{side}_char")
    return frozenset(out)


def _vectorizers(
    config: TrainConfig,
    vocab: dict[str, list[str]] | None,
    present: frozenset[str] | None = None,
) -> list[tuple]:
    out = []
    for side in ("mc", "open"):
        for kind in ("word", "char"):
            name = f"{side}_{kind}"
            if kind == "char" and side not in config.char_sides:
                continue
            if present is not None and name not in present:
                continue
            chosen = vocab.get(name) if vocab else None
            if vocab is not None and not chosen:
                continue
            params: dict[str, Any] = {"lowercase": False, "dtype": np.float32}
            if kind == "word":
                params["token_pattern"] = WORD_PATTERN
            else:
                params.update(analyzer="char", ngram_range=config.char_ngrams)
            if chosen:
                params["vocabulary"] = chosen
            else:
                params["max_features"] = config.candidate_features
            out.append((name, TfidfVectorizer(**params), f"{side}_text"))
    return out


def build_pipeline(
    config: TrainConfig,
    vocab: dict[str, list[str]] | None = None,
    present: frozenset[str] | None = None,
) -> Pipeline:
    """The untrained pipeline; `present` (present_blocks) limits the text blocks to those the
    training data has text for (None: all)."""
    vectorizers = _vectorizers(config, vocab, present)
    weights = {name: config.open_weight for name, _v, col in vectorizers if col == "open_text"}
    blocks = [*vectorizers, ("num", StandardScaler(), list(NUMERIC_INPUTS))]
    if config.prior_weight > 0:
        # The source prior reads one column range: its blocks first, adjacent, in their order.
        first = [b for name in config.prior_blocks for b in blocks if b[0] == name]
        blocks = first + [b for b in blocks if b[0] not in config.prior_blocks]
    features = ColumnTransformer(blocks, transformer_weights=weights or None)
    model = LogisticRegression(C=config.C, max_iter=3000, random_state=config.seed)
    return Pipeline([("features", features), ("model", model)])


class SourcePrior(TransformerMixin, BaseEstimator):
    """Appends one column to the features: the predicted source's prior gain, standardized.

    column = softmax(X[:, start:stop] @ coef_.T + intercept_) @ values_, where values_[k] is
    source k's mean gain on the training rows, centred and scaled by the cross-fitted column's
    mean and standard deviation, times `weight`. Fitted by `fit_sources`, not by `fit`.
    """

    def __init__(
        self,
        start: int = 0,
        stop: int = 0,
        C: float = 1.0,
        weight: float = 1.0,
        folds: int = 5,
        seed: int = 0,
        tol: float = 1e-4,
    ) -> None:
        self.start = start
        self.stop = stop
        self.C = C
        self.weight = weight
        self.folds = folds
        self.seed = seed
        self.tol = tol

    def _classifier(self) -> LogisticRegression:
        return LogisticRegression(C=self.C, max_iter=3000, tol=self.tol, random_state=self.seed)

    def _fit_one(self, x: Any, sources: np.ndarray, gains: np.ndarray) -> tuple:
        model = self._classifier().fit(x[:, self.start : self.stop], sources)
        means = np.array([gains[sources == c].mean() for c in model.classes_])
        return model, means

    def _splits(self, sources: np.ndarray) -> Any:
        _names, counts = np.unique(sources, return_counts=True)
        if counts.min() >= self.folds:
            return StratifiedKFold(self.folds, shuffle=True, random_state=self.seed).split(
                sources, sources
            )
        return KFold(self.folds, shuffle=True, random_state=self.seed).split(sources)

    def fit_sources(self, x: Any, sources: np.ndarray, gains: np.ndarray) -> np.ndarray:
        """Fit on all rows; return the rows' own column, cross-fitted (each row out of fold)."""
        column = np.zeros(x.shape[0])
        for train, test in self._splits(sources):
            model, means = self._fit_one(x[train], sources[train], gains[train])
            column[test] = model.predict_proba(x[test][:, self.start : self.stop]) @ means
        mean, std = column.mean(), column.std()
        std = std if std > 0 else 1.0
        self.classifier_, means = self._fit_one(x, sources, gains)
        self.values_ = (means - mean) / std * self.weight
        return (column - mean) / std * self.weight

    def column(self, x: Any) -> np.ndarray:
        return self.classifier_.predict_proba(x[:, self.start : self.stop]) @ self.values_

    def fit(self, x: Any, y: Any = None) -> SourcePrior:
        raise TypeError("SourcePrior is fitted by fit_sources(x, sources, gains)")

    def transform(self, x: Any) -> Any:
        return _append(x, self.column(x))


def _append(x: Any, column: np.ndarray) -> Any:
    if sparse.issparse(x):
        return sparse.hstack([x, sparse.csr_matrix(column[:, None])], format="csr")
    return np.hstack([x, column[:, None]])


def training_rows(dataset: RoutingDataset, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of rows with both outcomes known, and their gain classes (-1, 0, 1)."""
    rows = np.flatnonzero(known(dataset.small, dataset.large))
    return rows, gain_class(dataset.small[rows], dataset.large[rows], margin)


def _strongest(pipeline: Pipeline, config: TrainConfig) -> dict[str, list[str]]:
    """Per vectorizer, the n-grams with the largest weight (any class), in vocabulary order."""
    features: ColumnTransformer = pipeline.named_steps["features"]
    coef = np.abs(pipeline.named_steps["model"].coef_).max(axis=0)
    vocab: dict[str, list[str]] = {}
    for name, transformer, _column in features.transformers_:
        if not isinstance(transformer, TfidfVectorizer):
            continue
        terms = transformer.get_feature_names_out()
        weights = coef[features.output_indices_[name]]
        keep = config.keep_word if name.endswith("word") else config.keep_char
        top = np.sort(np.argsort(-weights, kind="stable")[:keep])
        vocab[name] = [str(terms[i]) for i in top]
    return vocab


def fit_frame(
    data: pd.DataFrame,
    labels: np.ndarray,
    config: TrainConfig,
    sources: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> Pipeline:
    """Two-stage fit on prepared inputs; deterministic for a given config.

    With `sources` (where each row came from) naming 2+ sources and config.prior_weight > 0, the
    final model also gets the source prior (SourcePrior) as an input. `weights` (one per row,
    > 0) weigh rows in the logistic regressions (e.g. a team's own traffic against the shipped
    training data); None weighs every row 1. The source prior's own fit is unweighted: it
    predicts where a prompt comes from, which the weights do not change.
    """
    if len(np.unique(labels)) < 2:
        raise ValueError("training data needs prompts where the two models' outcomes differ")
    present = present_blocks(data, config)
    fit_params = {} if weights is None else {"model__sample_weight": weights}
    first = build_pipeline(config, present=present).fit(data, labels, **fit_params)
    final = build_pipeline(config, _strongest(first, config))
    if sources is None or config.prior_weight <= 0 or len(np.unique(sources)) < 2:
        return final.fit(data, labels, **fit_params)
    features: ColumnTransformer = final.named_steps["features"]
    x = features.fit_transform(data)
    # build_pipeline put the prior's blocks first: they are the columns [0, stop).
    present = [b for b in config.prior_blocks if b in features.named_transformers_]
    stop = max((features.output_indices_[b].stop for b in present), default=0)
    if stop == 0:
        return final.fit(data, labels)
    prior = SourcePrior(
        0,
        stop,
        config.prior_C,
        config.prior_weight,
        config.prior_folds,
        config.seed,
        config.prior_tol,
    )
    column = prior.fit_sources(x, np.asarray(sources).astype(str), labels.astype(np.float64))
    model = final.named_steps["model"].fit(_append(x, column), labels, sample_weight=weights)
    return Pipeline([("features", features), ("prior", prior), ("model", model)])


def fit(
    dataset: RoutingDataset,
    config: TrainConfig,
    progress: Progress | None = None,
    weights: np.ndarray | None = None,
) -> Pipeline:
    """Fit on every labelled row of `dataset` (`weights`: one per dataset row, or None)."""
    step = progress or (lambda _msg: None)
    rows, labels = training_rows(dataset, config.margin)
    step("features")
    data = frame([dataset.prompts[i] for i in rows])
    step("fit")
    pipeline = fit_frame(
        data, labels, config, dataset.source[rows], None if weights is None else weights[rows]
    )
    step("done")
    return pipeline


def class_values(pipeline: Pipeline) -> list[float]:
    """Score = probabilities @ class_values (order of the model's classes)."""
    return [CLASS_VALUES[int(c)] for c in pipeline.named_steps["model"].classes_]


def predict_scores(pipeline: Pipeline, data: pd.DataFrame) -> np.ndarray:
    """The scikit-learn reference score (what the ONNX model must reproduce)."""
    return pipeline.predict_proba(data) @ np.asarray(class_values(pipeline))


def fold_splits(strata: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded (train, test) index pairs over len(strata) rows, stratified by `strata` when every
    stratum has at least `folds` rows (else plain shuffled folds: small or lopsided data)."""
    if folds < 2 or len(strata) < folds:
        raise ValueError(f"{len(strata)} distinct prompts cannot be split into {folds} folds")
    strata = np.asarray(strata).astype(str)
    _names, counts = np.unique(strata, return_counts=True)
    if counts.min() >= folds:
        splitter = StratifiedKFold(folds, shuffle=True, random_state=seed)
        return list(splitter.split(strata, strata))
    return list(KFold(folds, shuffle=True, random_state=seed).split(strata))


def cross_val_scores(
    dataset: RoutingDataset,
    config: TrainConfig,
    folds: int = 5,
    progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold scores for the labelled rows (folds stratified by benchmark, seeded)."""
    rows, labels = training_rows(dataset, config.margin)
    data = frame([dataset.prompts[i] for i in rows])
    sources = dataset.source[rows]
    strata = dataset.benchmark[rows].astype(str)
    scores = np.zeros(len(rows))
    for k, (train, test) in enumerate(fold_splits(strata, folds, config.seed)):
        if progress:
            progress(f"fold {k + 1}/{folds}")
        pipeline = fit_frame(data.iloc[train], labels[train], config, sources[train])
        scores[test] = predict_scores(pipeline, data.iloc[test])
    return rows, scores


@dataclass(frozen=True)
class OutOfFold:
    """Out-of-fold scores of the evaluated rows: `rows` (indices into the dataset), `scores`
    and `folds` (the fold each row was held out in), aligned."""

    rows: np.ndarray
    scores: np.ndarray
    folds: np.ndarray
    final: Pipeline | None = None  # with_final: the model fitted on every labelled row


def out_of_fold(
    dataset: RoutingDataset,
    config: TrainConfig,
    evaluated: np.ndarray | None = None,
    folds: int = 5,
    weights: np.ndarray | None = None,
    progress: Progress | None = None,
    inputs: pd.DataFrame | None = None,
    jobs: int = 1,
    with_final: bool = False,
) -> OutOfFold:
    """Out-of-fold scores of the labelled rows that `evaluated` (bool mask over the dataset; None:
    all) selects, each from a model fitted as `fit` fits (same weights) without that row's fold.
    `inputs`: `frame(dataset.prompts)` when the caller has it already (a benchmark that trains
    many times on rows of one pool prepares the inputs once). `jobs`: folds fitted at once, in
    forked workers (classifiers/forked.py); the scores do not depend on it. `with_final`: also
    fit the model `fit` fits (every labelled row, same weights) among them, as `final`.

    Rows outside `evaluated` (e.g. the shipped training data added to a team's own traffic) are
    in every fold's training set and are never scored: the figures are about the evaluated rows.
    Folds split the distinct prompts (repeats of a prompt share a fold), stratified by benchmark
    when they can be (fold_splits).
    """
    rows, labels = training_rows(dataset, config.margin)
    own = np.ones(len(rows), bool) if evaluated is None else np.asarray(evaluated, bool)[rows]
    if inputs is not None and len(inputs) != len(dataset):
        raise ValueError(f"inputs has {len(inputs)} rows for {len(dataset)} prompts")
    data = (
        frame([dataset.prompts[i] for i in rows])
        if inputs is None
        else inputs.iloc[rows].reset_index(drop=True)
    )
    sources = dataset.source[rows]
    w = None if weights is None else np.asarray(weights, np.float64)[rows]
    own_idx, base_idx = np.flatnonzero(own), np.flatnonzero(~own)
    scores = np.zeros(len(own_idx))
    fold_of = np.zeros(len(own_idx), np.int64)
    # Folds split distinct prompts (as the model sees them), not rows: live traffic repeats
    # prompts ("hello"), and a copy in the training folds would make a score in-sample.
    seen = (data["mc_text"] + "\x00" + data["open_text"]).to_numpy()[own_idx]
    _texts, first, group = np.unique(seen, return_index=True, return_inverse=True)
    strata = dataset.benchmark[rows][own_idx][first]
    tests = [np.flatnonzero(np.isin(group, g)) for _t, g in fold_splits(strata, folds, config.seed)]
    fits = [
        (np.concatenate([base_idx, own_idx[np.setdiff1d(np.arange(len(own_idx)), t)]]), t)
        for t in tests
    ]
    if progress:
        progress(
            f"fold 1/{folds}: fitting on {len(fits[0][0]):,} rows"
            + (f" ({min(jobs, folds)} at a time)" if jobs > 1 else "")
        )
    tasks: list[tuple[np.ndarray, np.ndarray | None]] = list(fits)
    if with_final:  # the model `fit` fits (every labelled row), beside the folds
        tasks.append((np.arange(len(rows)), None))
    shared_input = (data, labels, sources, w, own_idx, config)
    final: Pipeline | None = None
    # Each fit is independent: with jobs > 1 they run in forked workers (same results).
    with closing(forked_map(_fold_fit, tasks, shared_input, jobs)) as results:
        for k, ((_fit_idx, test), result) in enumerate(zip(tasks, results, strict=True)):
            if test is None:
                assert isinstance(result, Pipeline)
                final = result
                continue
            scores[test] = result
            fold_of[test] = k
            if progress and k + 1 < folds:
                progress(f"fold {k + 2}/{folds}: fitting on {len(fits[k + 1][0]):,} rows")
    return OutOfFold(rows[own_idx], scores, fold_of, final)


def _fold_fit(task: tuple[np.ndarray, np.ndarray | None]) -> np.ndarray | Pipeline:
    """One fit of `out_of_fold` (in a worker or not): a fold's, fitted without the fold's rows,
    gives their scores; the final one (no rows held out) gives the pipeline."""
    data, labels, sources, w, own_idx, config = shared()
    fit_idx, test = task
    pipeline = fit_frame(
        data.iloc[fit_idx],
        labels[fit_idx],
        config,
        sources[fit_idx],
        None if w is None else w[fit_idx],
    )
    if test is None:
        return pipeline
    return predict_scores(pipeline, data.iloc[own_idx[test]])


def with_overrides(config: TrainConfig, **overrides: Any) -> TrainConfig:
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})
