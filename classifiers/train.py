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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from classifiers.dataset import RoutingDataset
from classifiers.features import NUMERIC_INPUTS, model_inputs
from classifiers.labels import gain_class, known

# Words: maximal runs of 2+ word characters. classifiers.id_converter reproduces exactly this
# pattern in the ONNX graph from character ids (word boundaries = non-word characters).
WORD_PATTERN = r"(?u)\w{2,}"
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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def frame(prompts: list[str]) -> pd.DataFrame:
    return pd.DataFrame(model_inputs(prompts))


def _vectorizers(config: TrainConfig, vocab: dict[str, list[str]] | None) -> list[tuple]:
    out = []
    for side in ("mc", "open"):
        for kind in ("word", "char"):
            name = f"{side}_{kind}"
            if kind == "char" and side not in config.char_sides:
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


def build_pipeline(config: TrainConfig, vocab: dict[str, list[str]] | None = None) -> Pipeline:
    vectorizers = _vectorizers(config, vocab)
    weights = {name: config.open_weight for name, _v, col in vectorizers if col == "open_text"}
    features = ColumnTransformer(
        [*vectorizers, ("num", StandardScaler(), list(NUMERIC_INPUTS))],
        transformer_weights=weights or None,
    )
    model = LogisticRegression(C=config.C, max_iter=3000, random_state=config.seed)
    return Pipeline([("features", features), ("model", model)])


def training_rows(dataset: RoutingDataset, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of rows with both outcomes known, and their gain classes (-1, 0, 1)."""
    rows = np.flatnonzero(known(dataset.small, dataset.large))
    return rows, gain_class(dataset.small[rows], dataset.large[rows], margin)


def _strongest(pipeline: Pipeline, config: TrainConfig) -> dict[str, list[str]]:
    """Per vectorizer, the n-grams with the largest weight (any class), in vocabulary order."""
    features: ColumnTransformer = pipeline.named_steps["features"]
    coef = np.abs(pipeline.named_steps["model"].coef_).max(axis=0)
    vocab: dict[str, list[str]] = {}
    offset = 0
    for name, transformer, _column in features.transformers_:
        if not isinstance(transformer, TfidfVectorizer):
            continue
        terms = transformer.get_feature_names_out()
        weights = coef[offset : offset + len(terms)]
        offset += len(terms)
        keep = config.keep_word if name.endswith("word") else config.keep_char
        top = np.sort(np.argsort(-weights, kind="stable")[:keep])
        vocab[name] = [str(terms[i]) for i in top]
    return vocab


def fit_frame(data: pd.DataFrame, labels: np.ndarray, config: TrainConfig) -> Pipeline:
    """Two-stage fit on prepared inputs; deterministic for a given config."""
    if len(np.unique(labels)) < 2:
        raise ValueError("training data needs prompts where the two models' outcomes differ")
    first = build_pipeline(config).fit(data, labels)
    return build_pipeline(config, _strongest(first, config)).fit(data, labels)


def fit(
    dataset: RoutingDataset, config: TrainConfig, progress: Progress | None = None
) -> Pipeline:
    """Fit on every labelled row of `dataset`."""
    step = progress or (lambda _msg: None)
    rows, labels = training_rows(dataset, config.margin)
    step("features")
    data = frame([dataset.prompts[i] for i in rows])
    step("fit")
    pipeline = fit_frame(data, labels, config)
    step("done")
    return pipeline


def class_values(pipeline: Pipeline) -> list[float]:
    """Score = probabilities @ class_values (order of the model's classes)."""
    return [CLASS_VALUES[int(c)] for c in pipeline.named_steps["model"].classes_]


def predict_scores(pipeline: Pipeline, data: pd.DataFrame) -> np.ndarray:
    """The scikit-learn reference score (what the ONNX model must reproduce)."""
    return pipeline.predict_proba(data) @ np.asarray(class_values(pipeline))


def cross_val_scores(
    dataset: RoutingDataset,
    config: TrainConfig,
    folds: int = 5,
    progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Out-of-fold scores for the labelled rows (folds stratified by benchmark, seeded)."""
    rows, labels = training_rows(dataset, config.margin)
    data = frame([dataset.prompts[i] for i in rows])
    strata = dataset.benchmark[rows].astype(str)
    splitter = StratifiedKFold(folds, shuffle=True, random_state=config.seed)
    scores = np.zeros(len(rows))
    for k, (train, test) in enumerate(splitter.split(rows, strata)):
        if progress:
            progress(f"fold {k + 1}/{folds}")
        pipeline = fit_frame(data.iloc[train], labels[train], config)
        scores[test] = predict_scores(pipeline, data.iloc[test])
    return rows, scores


def fold_ids(dataset: RoutingDataset, rows: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """The fold each row is tested in (same split as cross_val_scores)."""
    strata = dataset.benchmark[rows].astype(str)
    out = np.zeros(len(rows), dtype=int)
    splitter = StratifiedKFold(folds, shuffle=True, random_state=seed)
    for k, (_train, test) in enumerate(splitter.split(rows, strata)):
        out[test] = k
    return out


def metadata_for(
    dataset: RoutingDataset, config: TrainConfig, pipeline: Pipeline, data: list[Path]
) -> dict[str, Any]:
    rows, labels = training_rows(dataset, config.margin)
    scores = predict_scores(pipeline, frame([dataset.prompts[i] for i in rows]))
    return {
        # Read by policies.registry when a policy names no threshold: the median training score,
        # i.e. about half of training-like traffic goes to the large tier.
        "default_threshold": round(float(np.median(scores)), 4),
        "train_config": config.as_dict(),
        "label": "expected gain of the large model: classes large worse/tie/better "
        f"(outcome difference beyond margin {config.margin})",
        "class_values": class_values(pipeline),
        "context_turns": 2,
        "data": [str(p) for p in data],
        "small_model": dataset.small_name,
        "large_model": dataset.large_name,
        "rows": int(len(rows)),
        "rows_per_benchmark": {
            b: int((dataset.benchmark[rows] == b).sum()) for b in dataset.benchmarks
        },
        "class_counts": {str(c): int((labels == c).sum()) for c in (-1, 0, 1)},
        "excluded_contaminated": dataset.excluded_contaminated,
    }


def with_overrides(config: TrainConfig, **overrides: Any) -> TrainConfig:
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})
