"""The TfidfVectorizer -> ONNX-over-character-ids converter counts what scikit-learn counts."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from skl2onnx import to_onnx
from skl2onnx.common.data_types import Int64TensorType
from sklearn.feature_extraction.text import TfidfVectorizer

from classifiers.features import char_ids
from classifiers.id_converter import register
from classifiers.train import WORD_PATTERN

# Word boundaries of every kind: punctuation, underscores, digits, one-letter words, repeats,
# words at the very start and end, non-BMP letters, combining marks, NUL.
DOCS = [
    "the cat sat on the mat",
    "a dog, the dog! x1 y_2 (cat)cat",
    "",
    "cat",
    "__init__ 3.14 a-b-c don't e.g. 40π ½",
    "𝐀𝐁 𝐀𝐁! 中文中文 ca\u0301t \x00zz\x00",
]


@pytest.mark.parametrize(
    "params",
    [
        {"token_pattern": WORD_PATTERN},
        {"analyzer": "char", "ngram_range": (3, 5)},
        {"analyzer": "char", "ngram_range": (1, 2), "use_idf": False},
    ],
)
def test_counts_match_sklearn(params: dict) -> None:
    register()
    vectorizer = TfidfVectorizer(lowercase=False, dtype=np.float32, **params).fit(DOCS)
    model = to_onnx(
        vectorizer, initial_types=[("x", Int64TensorType([None, None]))], target_opset=18
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    unseen = ["cat dog mat", "the the the", "xx_ 𝐀𝐁"]
    for docs in (DOCS, unseen, DOCS[:1]):
        expected = vectorizer.transform(docs).toarray()
        got = session.run(None, {"x": char_ids(docs)})[0]
        assert np.abs(got - expected).max() <= 1e-6


def test_unsupported_settings_are_refused() -> None:
    register()
    vectorizer = TfidfVectorizer(lowercase=False, ngram_range=(1, 2)).fit(DOCS)
    with pytest.raises(NotImplementedError, match="ngram_range"):
        to_onnx(vectorizer, initial_types=[("x", Int64TensorType([None, None]))])
