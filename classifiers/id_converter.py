"""skl2onnx converter: a fitted TfidfVectorizer -> ONNX over character ids. Offline only.

The request path feeds text as int64 character ids (classifiers.features.char_ids) instead of
strings: onnxruntime's string Tokenizer and string n-gram matching were most of the batch time.
This converter replaces skl2onnx's own one for TfidfVectorizer while exporting:

- analyzer="char": each vocabulary n-gram becomes its character ids; TfIdfVectorizer counts them.
- analyzer="word" (token pattern `(?u)\\w{2,}`: maximal runs of word characters): Max(ids, SEP)
  turns every non-word character and the padding into SEP, a SEP column is added at both ends,
  and each vocabulary word w is counted as the n-gram [SEP, w..., SEP]. Runs of word characters
  are exactly the tokens, so the counts equal scikit-learn's.

Then, as in scikit-learn: counts * idf, L2 row normalisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto
from skl2onnx import update_registered_converter
from skl2onnx.common.data_types import FloatTensorType
from sklearn.feature_extraction.text import TfidfVectorizer

from classifiers.features import SEP_ID, char_id
from classifiers.train import WORD_PATTERN


def _check(vectorizer: TfidfVectorizer) -> None:
    """Only the settings whose meaning this converter reproduces."""
    word = vectorizer.analyzer == "word" and vectorizer.token_pattern == WORD_PATTERN
    word = word and vectorizer.ngram_range == (1, 1)
    if not (word or vectorizer.analyzer == "char"):
        raise NotImplementedError(
            f"id converter: analyzer={vectorizer.analyzer!r}, "
            f"token_pattern={vectorizer.token_pattern!r}, ngram_range={vectorizer.ngram_range}"
        )
    if vectorizer.lowercase or vectorizer.sublinear_tf or vectorizer.binary:
        raise NotImplementedError("id converter: lowercase, sublinear_tf and binary must be off")
    if vectorizer.norm != "l2" or vectorizer.preprocessor or vectorizer.tokenizer:
        raise NotImplementedError("id converter: needs norm='l2' and no custom callables")


def _grams(vectorizer: TfidfVectorizer) -> list[tuple[list[int], int]]:
    """(ids of the n-gram as the graph sees it, output column), for every vocabulary entry."""
    out = []
    for term, column in vectorizer.vocabulary_.items():
        ids = [char_id(c) for c in term]
        if vectorizer.analyzer == "word":
            ids = [SEP_ID, *ids, SEP_ID]
        out.append((ids, int(column)))
    return out


def _pool(grams: Sequence[tuple[list[int], int]]) -> dict[str, Any]:
    """TfIdfVectorizer attributes: the pool holds n-grams grouped by length, shortest first."""
    ordered = sorted(grams, key=lambda g: (len(g[0]), g[1]))
    longest = len(ordered[-1][0])
    pool: list[int] = []
    indexes: list[int] = []
    starts: list[int] = []
    for length in range(1, longest + 1):
        starts.append(len(pool))
        for ids, column in ordered:
            if len(ids) == length:
                pool.extend(ids)
                indexes.append(column)
    return {
        "pool_int64s": pool,
        "ngram_counts": starts,
        "ngram_indexes": indexes,
        "min_gram_length": len(ordered[0][0]),
        "max_gram_length": longest,
        "max_skip_count": 0,
        "mode": "TF",
    }


def ordered_pool(vectorizer: TfidfVectorizer) -> tuple[dict[str, Any], list[int]]:
    """TfIdfVectorizer attributes whose output columns follow the pool order (ngram_indexes is the
    identity, so per-column `weights` mean the same under any reading of the spec), and the
    vocabulary column of each output column."""
    _check(vectorizer)
    grams = sorted(_grams(vectorizer), key=lambda g: (len(g[0]), g[1]))
    attributes = _pool(grams)
    attributes["ngram_indexes"] = list(range(len(grams)))
    return attributes, [column for _ids, column in grams]


def _const(scope: Any, container: Any, name: str, kind: int, values: np.ndarray) -> str:
    var = scope.get_unique_variable_name(name)
    container.add_initializer(var, kind, list(values.shape), values.ravel().tolist())
    return var


def convert(scope: Any, operator: Any, container: Any) -> None:
    vectorizer: TfidfVectorizer = operator.raw_operator
    _check(vectorizer)
    ids = operator.inputs[0].full_name
    if vectorizer.analyzer == "word":
        sep = _const(scope, container, "sep", TensorProto.INT64, np.array(SEP_ID))
        merged = scope.get_unique_variable_name("word_ids")
        container.add_node("Max", [ids, sep], merged, name=scope.get_unique_operator_name("Max"))
        pads = _const(scope, container, "pads", TensorProto.INT64, np.array([0, 1, 0, 1]))
        ids = scope.get_unique_variable_name("bounded")
        container.add_node(
            "Pad", [merged, pads, sep], ids, name=scope.get_unique_operator_name("Pad")
        )
    counts = scope.get_unique_variable_name("counts")
    container.add_node(
        "TfIdfVectorizer",
        [ids],
        counts,
        name=scope.get_unique_operator_name("TfIdfVectorizer"),
        **_pool(_grams(vectorizer)),
    )
    weighted = counts
    if vectorizer.use_idf:
        idf = _const(
            scope, container, "idf", TensorProto.FLOAT, vectorizer.idf_.astype(np.float32)
        )
        weighted = scope.get_unique_variable_name("weighted")
        container.add_node(
            "Mul", [counts, idf], weighted, name=scope.get_unique_operator_name("Mul")
        )
    # L2 row normalisation as scikit-learn's normalize (an all-zero row stays zero). Written
    # with ReduceL2 + Div: onnxruntime's ai.onnx.ml Normalizer was a third of the graph's time.
    axes = _const(scope, container, "axes", TensorProto.INT64, np.array([1]))
    norm = scope.get_unique_variable_name("norm")
    container.add_node(
        "ReduceL2", [weighted, axes], norm, keepdims=1, name=scope.get_unique_operator_name("L2")
    )
    tiny = _const(scope, container, "tiny", TensorProto.FLOAT, np.array(1e-30, np.float32))
    safe = scope.get_unique_variable_name("safe_norm")
    container.add_node("Max", [norm, tiny], safe, name=scope.get_unique_operator_name("Max"))
    container.add_node(
        "Div",
        [weighted, safe],
        operator.outputs[0].full_name,
        name=scope.get_unique_operator_name("Div"),
    )


def shape(operator: Any) -> None:
    rows = operator.inputs[0].get_first_dimension()
    size = len(operator.raw_operator.vocabulary_)
    operator.outputs[0].type = FloatTensorType([rows, size])


def register() -> None:
    """Make skl2onnx use this converter for TfidfVectorizer (this process only)."""
    update_registered_converter(TfidfVectorizer, "SklearnTfidfVectorizer", shape, convert)
