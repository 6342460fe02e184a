"""A fitted TfidfVectorizer's vocabulary as the int64 n-gram pool of ONNX's TfIdfVectorizer op.

The request path feeds text as int64 character ids (classifiers.features.char_ids) instead of
strings: onnxruntime's string Tokenizer and string n-gram matching were most of the batch time.
classifiers.export builds each vectorizer's TfIdfVectorizer node from `ordered_pool`:

- analyzer="char": each vocabulary n-gram becomes its character ids.
- analyzer="word" (token pattern `(?u)\\w{2,}`: maximal runs of word characters): the graph turns
  every non-word character and the padding into SEP with Max(ids, SEP) and adds a SEP column at
  both ends; each vocabulary word w is the n-gram [SEP, w..., SEP]. Runs of word characters are
  exactly the tokens, so the counts equal scikit-learn's.

Offline only (imports scikit-learn).
"""

from __future__ import annotations

from typing import Any

from sklearn.feature_extraction.text import TfidfVectorizer

from classifiers.features import SEP_ID, WORD_PATTERN, char_id


def _check(vectorizer: TfidfVectorizer) -> None:
    """Only the settings whose meaning the pool (and the graph around it) reproduces."""
    word = vectorizer.analyzer == "word" and vectorizer.token_pattern == WORD_PATTERN
    word = word and vectorizer.ngram_range == (1, 1)
    if not (word or vectorizer.analyzer == "char"):
        raise NotImplementedError(
            f"n-gram pool: analyzer={vectorizer.analyzer!r}, "
            f"token_pattern={vectorizer.token_pattern!r}, ngram_range={vectorizer.ngram_range}"
        )
    if vectorizer.lowercase or vectorizer.sublinear_tf or vectorizer.binary:
        raise NotImplementedError("n-gram pool: lowercase, sublinear_tf and binary must be off")
    if vectorizer.norm != "l2" or vectorizer.preprocessor or vectorizer.tokenizer:
        raise NotImplementedError("n-gram pool: needs norm='l2' and no custom callables")


def _grams(vectorizer: TfidfVectorizer) -> list[tuple[list[int], int]]:
    """(ids of the n-gram as the graph sees it, output column), for every vocabulary entry."""
    out = []
    for term, column in vectorizer.vocabulary_.items():
        ids = [char_id(c) for c in term]
        if vectorizer.analyzer == "word":
            ids = [SEP_ID, *ids, SEP_ID]
        out.append((ids, int(column)))
    return out


def ordered_pool(vectorizer: TfidfVectorizer) -> tuple[dict[str, Any], list[int]]:
    """TfIdfVectorizer attributes (mode TF) and the vocabulary column of each output column.

    The pool holds the n-grams grouped by length, shortest first, and the op's output columns
    follow the pool order (ngram_indexes is the identity, so per-column `weights` mean the same
    under any reading of the spec); the caller reorders its weights by the returned columns.
    """
    _check(vectorizer)
    grams = sorted(_grams(vectorizer), key=lambda g: (len(g[0]), g[1]))
    longest = len(grams[-1][0])
    pool: list[int] = []
    starts: list[int] = []
    for length in range(1, longest + 1):
        starts.append(len(pool))
        for ids, _column in grams:
            if len(ids) == length:
                pool.extend(ids)
    attributes = {
        "pool_int64s": pool,
        "ngram_counts": starts,
        "ngram_indexes": list(range(len(grams))),
        "min_gram_length": len(grams[0][0]),
        "max_gram_length": longest,
        "max_skip_count": 0,
        "mode": "TF",
    }
    return attributes, [column for _ids, column in grams]
