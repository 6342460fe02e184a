"""scikit-learn pipeline -> ONNX + a metadata JSON next to it. Offline only.

The pipeline classifiers.train builds (ColumnTransformer of TfidfVectorizers + StandardScaler,
optionally classifiers.train.SourcePrior, then LogisticRegression) is written as a lean graph built
here directly. A generic converter (skl2onnx) builds every vectorizer's normalised [rows,
vocabulary] matrix, concatenates them and only then applies the linear model; here the algebra is
folded instead. For each vectorizer b with transformer weight t_b and coefficient block W_b,

    logits += (tfidf_b @ (t_b * W_b)) / ||tfidf_b||

where tfidf_b = counts_b * idf_b comes straight out of the TfIdfVectorizer op (mode TFIDF) and the
norm is one Mul + ReduceSum: no full-width idf Mul, Div or Concat. The scaler is folded into the
numeric weights, and the source prior's logits (a linear function of the same blocks) come out of
the same MatMuls (extra columns). The text blocks' logits are [1, K] when their input has one row,
so a batch whose rows all leave one text input empty may feed it as a single padding row
(classifiers.features.BROADCAST_KEY). The numeric features come as one [rows, features] input
(classifiers.features.PACKED_INPUTS): onnxruntime's cost per input dominated a one-prompt run
when each feature had its own. Pipelines of any other shape are refused
(NotImplementedError), and so is a graph that would not score probe texts as scikit-learn does:
training builds no other shape, so there is no generic fallback.
"""

from __future__ import annotations

import hashlib
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from sklearn.compose import ColumnTransformer
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from classifiers.dataset import RoutingDataset
from classifiers.features import (
    BROADCAST_KEY,
    NUMERIC_INPUT,
    NUMERIC_INPUTS,
    PACKED_INPUTS,
    SEP_ID,
    TEXT_INPUTS,
    clean_text,
    is_multiple_choice,
    model_feed,
)
from classifiers.model_files import ModelFiles
from classifiers.ngram_pool import ordered_pool
from classifiers.train import (
    SourcePrior,
    TrainConfig,
    class_values,
    frame,
    predict_scores,
    training_rows,
)

TARGET_OPSET = 18
OUTPUT = "probabilities"
# Smallest norm divided by: an all-zero row stays zero, as in scikit-learn's normalize.
TINY = 1e-30


class _Graph:
    """Nodes and initializers with deterministic names (same pipeline -> same bytes)."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, hint: str, values: np.ndarray) -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(values), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str, **attrs: Any) -> str:
        out = self.name(hint)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out + "_op", **attrs))
        return out


def _parts(pipeline: Pipeline) -> tuple[ColumnTransformer, SourcePrior | None, LogisticRegression]:
    """(features, source prior or None, final model), or NotImplementedError."""
    steps = [step for _name, step in pipeline.steps]
    prior = steps[1] if len(steps) == 3 else None
    if len(steps) not in (2, 3) or (prior is not None and not _is_prior(prior)):
        raise NotImplementedError("lean export: expected ColumnTransformer [-> SourcePrior] -> LR")
    features, model = steps[0], steps[-1]
    if not isinstance(features, ColumnTransformer) or type(model) is not LogisticRegression:
        raise NotImplementedError("lean export: expected ColumnTransformer [-> SourcePrior] -> LR")
    return features, prior, model


def _is_prior(step: Any) -> bool:
    # A fitted SourcePrior: appends softmax(X[:, start:stop] @ W.T + b) @ values_.
    return (
        isinstance(step, SourcePrior)
        and hasattr(step, "classifier_")
        and type(step.classifier_) is LogisticRegression
    )


def _softmax_weights(model: LogisticRegression) -> tuple[np.ndarray, np.ndarray]:
    """[classes, features] weights and intercepts whose softmax is model.predict_proba."""
    coef, intercept = np.asarray(model.coef_, np.float64), np.asarray(model.intercept_, np.float64)
    if coef.shape[0] == 1 and len(model.classes_) == 2:  # sigmoid(z) = softmax([0, z])
        return np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    if coef.shape[0] != len(model.classes_):
        raise NotImplementedError(f"lean export: coef_ shape {coef.shape}")
    return coef, intercept


class _Heads:
    """Linear functions of the feature matrix X computed block by block (one MatMul per block):
    the final model's logits and, with a source prior, the prior classifier's logits."""

    def __init__(self, weights: list[np.ndarray]) -> None:
        self.weights = weights  # per head: [outputs, features of X]
        self.parts: list[list[str]] = [[] for _ in weights]
        self.offsets = [np.zeros(w.shape[0]) for w in weights]

    def block(self, block: slice, scale: float) -> list[tuple[int, np.ndarray]]:
        """(head, [block width, outputs] weights) for the heads that read this block."""
        out = []
        for head, w in enumerate(self.weights):
            part = w[:, block].T * scale
            if part.any():
                out.append((head, part))
        return out

    def add(self, graph: _Graph, logits: str, heads: list[tuple[int, np.ndarray]]) -> None:
        if len(heads) == 1:
            self.parts[heads[0][0]].append(logits)
            return
        sizes = graph.const("sizes", np.array([w.shape[1] for _h, w in heads], np.int64))
        outs = [graph.name("head") for _ in heads]
        graph.nodes.append(helper.make_node("Split", [logits, sizes], outs, axis=1, name=outs[0]))
        for (head, _w), out in zip(heads, outs, strict=True):
            self.parts[head].append(out)


def _text_block(graph: _Graph, vectorizer: TfidfVectorizer, column: str, w: np.ndarray) -> str:
    """(tfidf @ w) / ||tfidf|| for one vectorizer, w [vocabulary, outputs] in vocabulary order."""
    attributes, columns = ordered_pool(vectorizer)  # refuses settings the graph cannot reproduce
    if vectorizer.use_idf:
        attributes["mode"] = "TFIDF"
        attributes["weights"] = vectorizer.idf_.astype(np.float32)[columns].tolist()
    ids = column
    if vectorizer.analyzer == "word":
        # Words are counted as [SEP, word..., SEP] (see classifiers.ngram_pool).
        sep = graph.const("sep", np.array(SEP_ID, np.int64))
        merged = graph.op("Max", [ids, sep], "word_ids")
        pads = graph.const("pads", np.array([0, 1, 0, 1], np.int64))
        ids = graph.op("Pad", [merged, pads, sep], "bounded")
    tfidf = graph.op("TfIdfVectorizer", [ids], "tfidf", **attributes)
    axes = graph.const("axes", np.array([1], np.int64))
    # Mul + ReduceSum: onnxruntime's ReduceSumSquare took twice as long.
    squared = graph.op("Mul", [tfidf, tfidf], "squared")
    squares = graph.op("ReduceSum", [squared, axes], "squares", keepdims=1)
    norm = graph.op("Sqrt", [squares], "norm")
    safe = graph.op("Max", [norm, graph.const("tiny", np.array(TINY, np.float32))], "safe_norm")
    weights = graph.const("coef", w[columns].astype(np.float32))
    return graph.op("Div", [graph.op("MatMul", [tfidf, weights], "dot"), safe], "logits")


def _numeric_block(
    graph: _Graph, scaler: StandardScaler, columns: list[str], w: np.ndarray, packed: bool
) -> tuple[str, np.ndarray]:
    """Logits of the standardized numeric features, scaler folded into the weights:
    ((x - mean) / scale) @ w = x @ (w / scale) - (mean / scale) @ w. Returns (logits, offset).
    `packed`: x is (columns of) the one `numeric` input, else the Concat of one input each."""
    scale = scaler.scale_ if scaler.with_std else np.ones(len(columns))
    mean = scaler.mean_ if scaler.with_mean else np.zeros(len(columns))
    folded = w / np.asarray(scale, dtype=np.float64)[:, None]
    if not packed:
        x = graph.op("Concat", list(columns), "numeric", axis=1)
    elif list(columns) == list(NUMERIC_INPUTS):
        x = NUMERIC_INPUT
    else:
        at = graph.const("columns", np.array([NUMERIC_INPUTS.index(c) for c in columns], np.int64))
        x = graph.op("Gather", [NUMERIC_INPUT, at], "numeric", axis=1)
    logits = graph.op("MatMul", [x, graph.const("coef", folded.astype(np.float32))], "logits")
    return logits, -np.asarray(mean, dtype=np.float64) @ folded


def _blocks(graph: _Graph, features: ColumnTransformer, heads: _Heads, packed: bool) -> None:
    weights = features.transformer_weights or {}
    for name, transformer, columns in features.transformers_:
        block = features.output_indices_[name]
        if block.stop == block.start:
            continue  # e.g. an empty "remainder"
        reading = heads.block(block, weights.get(name, 1.0))
        if not reading:
            continue  # all-zero weights (never for a fitted model, but harmless)
        w = np.hstack([part for _head, part in reading])
        if isinstance(transformer, TfidfVectorizer) and columns in TEXT_INPUTS:
            heads.add(graph, _text_block(graph, transformer, columns, w), reading)
        elif isinstance(transformer, StandardScaler) and set(columns) <= set(NUMERIC_INPUTS):
            logits, offset = _numeric_block(graph, transformer, list(columns), w, packed)
            heads.add(graph, logits, reading)
            at = 0
            for head, part in reading:
                heads.offsets[head] += offset[at : at + part.shape[1]]
                at += part.shape[1]
        else:
            raise NotImplementedError(f"lean export: transformer {name!r} ({transformer!r})")


def _prior_logits(graph: _Graph, heads: _Heads, prior: SourcePrior, coef: np.ndarray) -> str:
    """The final model's logits from the source prior's column: column @ coef[:, -1]."""
    _w, intercept = _softmax_weights(prior.classifier_)
    bias = graph.const("prior_intercept", (intercept + heads.offsets[1]).astype(np.float32))
    proba = graph.op(
        "Softmax", [graph.op("Sum", [*heads.parts[1], bias], "prior_sum")], "prior_p", axis=1
    )
    values = graph.const("prior_values", np.asarray(prior.values_, np.float32)[:, None])
    column = graph.op("MatMul", [proba, values], "prior_column")
    scale = graph.const("prior_coef", coef[:, -1:].T.astype(np.float32))
    return graph.op("MatMul", [column, scale], "prior_logits")


def lean_model(pipeline: Pipeline, packed: bool = True) -> onnx.ModelProto:
    """The pipeline as a lean ONNX graph (NotImplementedError for shapes it does not cover).
    `packed`: the numeric features as one input (PACKED_INPUTS, what `export` writes); False
    writes the former graph with one input per feature (MODEL_INPUTS), which still loads."""
    features, prior, model = _parts(pipeline)
    classes = len(model.classes_)
    coef = np.asarray(model.coef_, dtype=np.float64)
    width = max(s.stop for s in features.output_indices_.values())
    if coef.shape[1] != width + (prior is not None):
        raise NotImplementedError(f"lean export: {coef.shape[1]} weights for {width} features")
    weights = [coef[:, :width]]
    if prior is not None:
        prior_w, _b = _softmax_weights(prior.classifier_)
        full = np.zeros((prior_w.shape[0], width))
        full[:, prior.start : prior.stop] = prior_w
        weights.append(full)
    graph = _Graph()
    heads = _Heads(weights)
    _blocks(graph, features, heads, packed)
    logits = heads.parts[0]
    if prior is not None:
        logits = [*logits, _prior_logits(graph, heads, prior, coef)]
    intercept = graph.const("intercept", (model.intercept_ + heads.offsets[0]).astype(np.float32))
    total = graph.op("Sum", [*logits, intercept], "sum")  # one node: broadcasts like Add
    if classes == 2 and coef.shape[0] == 1:
        # Binary: P(class 1) = sigmoid(z), as scikit-learn's predict_proba.
        p1 = graph.op("Sigmoid", [total], "p1")
        p0 = graph.op("Sub", [graph.const("one", np.array(1.0, np.float32)), p1], "p0")
        graph.nodes.append(helper.make_node("Concat", [p0, p1], [OUTPUT], name="proba", axis=1))
    elif coef.shape[0] == classes:
        graph.nodes.append(helper.make_node("Softmax", [total], [OUTPUT], name="proba", axis=1))
    else:
        raise NotImplementedError(f"lean export: coef_ shape {coef.shape}")
    # Each text input has its own dimension names: onnxruntime takes equal names for equal sizes.
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, [f"{name}_rows", f"{name}_chars"])
        for name in TEXT_INPUTS
    ]
    if packed:
        width = len(NUMERIC_INPUTS)
        inputs.append(
            helper.make_tensor_value_info(NUMERIC_INPUT, TensorProto.FLOAT, ["rows", width])
        )
    else:
        inputs += [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["rows", 1])
            for name in NUMERIC_INPUTS
        ]
    output = helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["rows", classes])
    onnx_graph = helper.make_graph(
        graph.nodes, "cost_router_classifier", inputs, [output], graph.initializers
    )
    onnx_model = helper.make_model(
        onnx_graph,
        opset_imports=[helper.make_opsetid("", TARGET_OPSET)],
        producer_name="cost-router",
        ir_version=8,
    )
    # Broadcasting a one-row text input needs another input that carries the batch's rows.
    numeric = any(set(n.input) & {NUMERIC_INPUT, *NUMERIC_INPUTS} for n in graph.nodes)
    helper.set_model_props(onnx_model, {BROADCAST_KEY: "1" if numeric else "0"})
    onnx.checker.check_model(onnx_model)
    return onnx_model


# Texts the lean graph must score as scikit-learn does before it is used (a structural check:
# the tests and benchmarks/classifier_parity.py check parity on real prompts).
_PROBES = [
    "Which is a prime?\nA. 4\nB. 6\nC. 7\nD. 9\nAnswer:",
    "Natalia sold clips to 48 of her friends in April. How many clips did she sell in May?",
    "def f(x):\n    return x ** 2  # sqrt? {}",
    "Ünïcödé 中文 ½ × 3",
    "",
]


def _same_as_sklearn(pipeline: Pipeline, model: onnx.ModelProto) -> bool:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    cleans = [clean_text(t) for t in _PROBES]
    packed = NUMERIC_INPUT in {i.name for i in session.get_inputs()}
    feed = model_feed(cleans, [is_multiple_choice(c) for c in cleans], packed=packed)
    got = session.run([OUTPUT], feed)[0]
    expected = pipeline.predict_proba(frame(_PROBES))
    return got.shape == expected.shape and float(np.abs(got - expected).max()) <= 1e-5


def to_onnx_bytes(pipeline: Pipeline, packed: bool = True) -> bytes:
    """The lean graph, checked on probe texts (NotImplementedError for a pipeline it cannot
    reproduce)."""
    model = lean_model(pipeline, packed)
    if not _same_as_sklearn(pipeline, model):
        raise NotImplementedError("lean export: the graph disagrees with scikit-learn on probes")
    return model.SerializeToString()


# A rebuild is byte-identical only with these versions (recorded in the metadata): the solvers'
# results drift across releases (measured: up to 0.0135 in score between scikit-learn releases).
BUILD_LIBRARIES = ("scikit-learn", "scipy", "numpy", "onnx")


def metadata_for(
    dataset: RoutingDataset, config: TrainConfig, pipeline: Pipeline, data: list[Path]
) -> dict[str, Any]:
    """What `export` writes beside the model about its training: config, data, threshold
    (`export` itself adds the model's format: class values, context turns, inputs)."""
    rows, labels = training_rows(dataset, config.margin)
    scores = predict_scores(pipeline, frame([dataset.prompts[i] for i in rows]))
    return {
        # Read by policies.registry when a policy names no threshold: the median training score,
        # i.e. about half of training-like traffic goes to the large tier.
        "default_threshold": round(float(np.median(scores)), 4),
        "built_with": {name: version(name) for name in BUILD_LIBRARIES},
        "train_config": config.as_dict(),
        "label": "expected gain of the large model: classes large worse/tie/better "
        f"(outcome difference beyond margin {config.margin})",
        # Folder names only: a card must not carry a path of the machine it was built on.
        "data": [Path(p).name for p in data],
        "small_model": dataset.small_name,
        "large_model": dataset.large_name,
        "rows": int(len(rows)),
        "rows_per_benchmark": {
            b: int((dataset.benchmark[rows] == b).sum()) for b in dataset.benchmarks
        },
        "class_counts": {str(c): int((labels == c).sum()) for c in (-1, 0, 1)},
        "excluded_contaminated": dataset.excluded_contaminated,
    }


def export(pipeline: Pipeline, path: str | Path, metadata: dict[str, Any]) -> dict[str, Any]:
    """Write `path` (.onnx) and its metadata JSON; returns the metadata written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = to_onnx_bytes(pipeline)
    path.write_bytes(blob)
    meta = {
        "class_values": class_values(pipeline),
        "context_turns": 2,
        **metadata,
        "format": "cost-router-classifier/1",
        "onnx_file": path.name,
        "onnx_sha256": hashlib.sha256(blob).hexdigest(),
        "onnx_bytes": len(blob),
        "inputs": list(PACKED_INPUTS),
        "output": OUTPUT,
    }
    ModelFiles(path).card.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta
