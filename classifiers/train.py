"""Fit the difficulty classifier: TF-IDF word + character n-grams and numeric features -> a
probability-calibrated logistic regression. Offline only (imports scikit-learn and pandas).

The pipeline takes a DataFrame with a `text` column (normalized by classifiers.features) and one
column per numeric feature; skl2onnx turns each column into a graph input of the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from sklearn.calibration import CalibratedClassifierCV
from sklearn.compose import ColumnTransformer
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from classifiers.dataset import RoutingDataset
from classifiers.features import NUMERIC_FEATURES, model_inputs
from classifiers.labels import known, needs_large

# Words of 2+ letters/digits. The same pattern is given to the ONNX tokenizer (RE2 syntax) in
# export.py; scikit-learn's default pattern tokenizes ~0.2% of prompts differently from RE2.
WORD_PATTERN = r"(?u)\w{2,}"

Progress = Callable[[str], None]


@dataclass
class TrainConfig:
    """Everything that decides the model; saved in the metadata so a model can be rebuilt."""

    seed: int = 0
    margin: float = 0.0
    word_features: int = 5000
    char_features: int = 3000
    char_ngrams: tuple[int, int] = (3, 4)
    C: float = 1.0
    calibration_folds: int = 5
    extra: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def frame(texts: list[str], numeric: np.ndarray) -> pd.DataFrame:
    columns: dict[str, object] = {"text": texts}
    for i, name in enumerate(NUMERIC_FEATURES):
        columns[name] = numeric[:, i]
    return pd.DataFrame(columns)


def prompts_frame(prompts: list[str]) -> pd.DataFrame:
    return frame(*model_inputs(prompts))


def build_pipeline(config: TrainConfig) -> Pipeline:
    features = ColumnTransformer(
        [
            (
                "word",
                TfidfVectorizer(
                    lowercase=False,
                    token_pattern=WORD_PATTERN,
                    max_features=config.word_features,
                    dtype=np.float32,
                ),
                "text",
            ),
            (
                "char",
                TfidfVectorizer(
                    lowercase=False,
                    analyzer="char",
                    ngram_range=config.char_ngrams,
                    max_features=config.char_features,
                    dtype=np.float32,
                ),
                "text",
            ),
            ("num", StandardScaler(), list(NUMERIC_FEATURES)),
        ]
    )
    linear = LogisticRegression(C=config.C, max_iter=2000)
    model = CalibratedClassifierCV(
        linear, method="sigmoid", cv=config.calibration_folds, ensemble=False
    )
    return Pipeline([("features", features), ("model", model)])


def training_rows(dataset: RoutingDataset, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of labelled rows and their labels."""
    rows = np.flatnonzero(known(dataset.small, dataset.large))
    return rows, needs_large(dataset.small[rows], dataset.large[rows], margin)


def fit(
    dataset: RoutingDataset, config: TrainConfig, progress: Progress | None = None
) -> Pipeline:
    """Fit on every labelled row of `dataset`; deterministic for a given config.seed."""
    step = progress or (lambda _msg: None)
    rows, labels = training_rows(dataset, config.margin)
    if len(np.unique(labels)) < 2:
        raise ValueError("training data needs both labels (some prompts where large beats small)")
    step("features")
    data = prompts_frame([dataset.prompts[i] for i in rows])
    step("fit")
    pipeline = build_pipeline(config)
    np.random.seed(config.seed)
    pipeline.fit(data, labels)
    step("done")
    return pipeline
