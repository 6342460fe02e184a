"""Fit prompt clusters (classifiers/prompt_clusters.py) with scikit-learn; written as ONNX.

Training side only (scikit-learn, onnx): `cost-router distill clusters` calls it. The graph is
built as the classifier's is (classifiers/export.py's text block over character ids, the words
of classifiers.features.WORD_PATTERN): for L2-normalised tf-idf x the nearest centroid c is the
one maximising 2 x.c - |c|^2, one MatMul and an ArgMax. The written graph is checked against
scikit-learn on every fitted prompt: a model that assigns any of them differently is refused,
not written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper
from sklearn.cluster import KMeans
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import Pipeline

from classifiers.export import TARGET_OPSET, _Graph, _text_block
from classifiers.features import WORD_PATTERN
from classifiers.prompt_clusters import (
    FORMAT,
    INPUT,
    META_KEY,
    NO_CLUSTER,
    OUTPUT,
    PromptClusters,
)

TOP_TERMS = 8


class ClusterFitError(ValueError):
    """Too few prompts or words to cluster; the message says what there was."""


@dataclass(frozen=True)
class FittedClusters:
    onnx: bytes
    sizes: list[int]
    terms: list[list[str]]
    texts: list[str]
    labels: list[int]


def fit_clusters(
    texts: Sequence[str], k: int, *, seed: int = 0, max_features: int = 5000
) -> FittedClusters:
    """k-means over the tf-idf of normalized prompt texts (`cluster_text`)."""
    if k < 2:
        raise ClusterFitError(f"--k must be at least 2, got {k}")
    texts = [t for t in texts if t.strip()]
    if len(texts) < 2 * k:
        raise ClusterFitError(f"{len(texts)} prompts cannot make {k} clusters (need >= {2 * k})")
    vectorizer = TfidfVectorizer(
        lowercase=False,
        token_pattern=WORD_PATTERN,
        # No stop-word list: "how many ... each" is what marks a task's shape (measured,
        # benchmarks/prompt_clusters.py: the held-out GSM8K prompts found 92% without, 15% with
        # scikit-learn's English list, which leaves only topic words).
        max_df=0.5,
        min_df=2 if len(texts) >= 50 else 1,
        max_features=max_features,
    )
    pipe = Pipeline(
        [("tfidf", vectorizer), ("kmeans", KMeans(n_clusters=k, n_init=4, random_state=seed))]
    )
    try:
        labels = pipe.fit_predict(texts)
    except ValueError as exc:  # e.g. every word pruned by max_df/min_df
        raise ClusterFitError(f"cannot cluster these prompts: {exc}") from None
    vocab = vectorizer.get_feature_names_out()
    centers = pipe.named_steps["kmeans"].cluster_centers_
    terms = [[str(vocab[i]) for i in np.argsort(-c)[:TOP_TERMS]] for c in centers]
    sizes = np.bincount(labels, minlength=k).tolist()
    onx = _graph(vectorizer, centers)
    meta = {
        "format": FORMAT,
        "k": k,
        "sizes": sizes,
        "terms": terms,
        "vocabulary": [str(w) for w in vocab],
        "prompts": len(texts),
        "seed": seed,
    }
    helper.set_model_props(onx, {META_KEY: json.dumps(meta)})
    return FittedClusters(
        onx.SerializeToString(), sizes, terms, list(texts), [int(c) for c in labels]
    )


def _graph(vectorizer: TfidfVectorizer, centers: np.ndarray) -> onnx.ModelProto:
    graph = _Graph()
    dots = _text_block(graph, vectorizer, INPUT, 2.0 * centers.T)  # 2 x.c, [rows, k]
    bias = graph.const("minus_sq_norm", -(centers**2).sum(axis=1).astype(np.float32))
    near = graph.op("Add", [dots, bias], "closeness")
    graph.nodes.append(
        helper.make_node("ArgMax", [near], [OUTPUT], name="nearest", axis=1, keepdims=0)
    )
    model = helper.make_model(
        helper.make_graph(
            graph.nodes,
            "cost_router_prompt_clusters",
            [helper.make_tensor_value_info(INPUT, TensorProto.INT64, ["rows", "chars"])],
            [helper.make_tensor_value_info(OUTPUT, TensorProto.INT64, ["rows"])],
            graph.initializers,
        ),
        opset_imports=[helper.make_opsetid("", TARGET_OPSET)],
        producer_name="cost-router",
        ir_version=8,
    )
    onnx.checker.check_model(model)
    return model


def write_clusters(fitted: FittedClusters, out: Path) -> dict[str, Any]:
    """Write the model, checked to assign every fitted prompt as scikit-learn did (a prompt
    without a known word is skipped: the request side puts it in no cluster); its summary."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(fitted.onnx)
    try:
        model = PromptClusters.load(tmp)
        got = model.assign(fitted.texts)
    except Exception:
        tmp.unlink()
        raise
    differ = sum(g != w for g, w in zip(got, fitted.labels, strict=True) if g != NO_CLUSTER)
    if differ:
        tmp.unlink()
        raise ClusterFitError(
            f"the ONNX graph assigns {differ} of {len(got)} prompts differently from "
            "scikit-learn: not written"
        )
    tmp.replace(out)
    return {"file": str(out), "k": model.k, "sizes": fitted.sizes, "terms": fitted.terms}
