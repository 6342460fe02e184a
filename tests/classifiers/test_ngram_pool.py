"""A vectorizer's block of the exported graph (classifiers.ngram_pool's n-gram pool over character
ids, inside classifiers.export's graph) counts what scikit-learn counts."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from sklearn.feature_extraction.text import TfidfVectorizer

from classifiers.export import TARGET_OPSET, _Graph, _text_block
from classifiers.features import char_ids
from classifiers.ngram_pool import ordered_pool
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


def _block_session(vectorizer: TfidfVectorizer) -> ort.InferenceSession:
    """The graph's block for one vectorizer with identity weights: its output is the normalised
    tf-idf row in vocabulary order, which is what scikit-learn's transform gives."""
    graph = _Graph()
    size = len(vectorizer.vocabulary_)
    logits = _text_block(graph, vectorizer, "x", np.eye(size))
    graph.nodes.append(helper.make_node("Identity", [logits], ["y"]))
    model = helper.make_model(
        helper.make_graph(
            graph.nodes,
            "block",
            [helper.make_tensor_value_info("x", TensorProto.INT64, ["rows", "chars"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", size])],
            graph.initializers,
        ),
        opset_imports=[helper.make_opsetid("", TARGET_OPSET)],
        ir_version=8,
    )
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "params",
    [
        {"token_pattern": WORD_PATTERN},
        {"analyzer": "char", "ngram_range": (3, 5)},
        {"analyzer": "char", "ngram_range": (1, 2), "use_idf": False},
    ],
)
def test_counts_match_sklearn(params: dict) -> None:
    vectorizer = TfidfVectorizer(lowercase=False, dtype=np.float32, **params).fit(DOCS)
    session = _block_session(vectorizer)
    unseen = ["cat dog mat", "the the the", "xx_ 𝐀𝐁"]
    for docs in (DOCS, unseen, DOCS[:1]):
        expected = vectorizer.transform(docs).toarray()
        got = session.run(None, {"x": char_ids(docs)})[0]
        assert np.abs(got - expected).max() <= 1e-6


def test_unsupported_settings_are_refused() -> None:
    for params in ({"ngram_range": (1, 2)}, {"analyzer": "char_wb"}, {"sublinear_tf": True}):
        vectorizer = TfidfVectorizer(lowercase=False, **params).fit(DOCS)
        with pytest.raises(NotImplementedError, match="n-gram pool"):
            ordered_pool(vectorizer)
