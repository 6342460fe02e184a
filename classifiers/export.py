"""scikit-learn pipeline -> ONNX (skl2onnx) + a metadata JSON next to it. Offline only."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType, StringTensorType
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import Pipeline

from classifiers.features import MODEL_INPUTS, NUMERIC_INPUTS, TEXT_INPUTS
from classifiers.train import class_values

# RE2 equivalent of train.WORD_PATTERN; onnxruntime's tokenizer is RE2 and has no `(?u)`.
RE2_WORD_PATTERN = r"[\p{L}\p{N}_]{2,}"
# Text is lowercased in classifiers.features, so the graph never changes case; the locale is
# still required by the converter's StringNormalizer and en_US.UTF-8 is missing on slim images.
LOCALE = "C.UTF-8"
TARGET_OPSET = 18
OUTPUT = "probabilities"


def metadata_path(model_path: str | Path) -> Path:
    return Path(model_path).with_suffix(".json")


def _converter_options(pipeline: Pipeline) -> dict[int, dict[str, Any]]:
    options: dict[int, dict[str, Any]] = {id(pipeline.steps[-1][1]): {"zipmap": False}}
    for _name, transformer, _cols in pipeline.named_steps["features"].transformers_:
        if isinstance(transformer, TfidfVectorizer):
            opts: dict[str, Any] = {"locale": LOCALE}
            if transformer.analyzer == "word":
                opts["tokenexp"] = RE2_WORD_PATTERN
            options[id(transformer)] = opts
    return options


def to_onnx_bytes(pipeline: Pipeline) -> bytes:
    inputs: list[tuple[str, Any]] = [(name, StringTensorType([None, 1])) for name in TEXT_INPUTS]
    inputs += [(name, FloatTensorType([None, 1])) for name in NUMERIC_INPUTS]
    with warnings.catch_warnings():
        # skl2onnx warns that analyzer="char" "may not work": the parity test checks it does,
        # given the whitespace collapsing done in classifiers.features.
        warnings.filterwarnings("ignore", message="The conversion of CountVectorizer")
        model = to_onnx(
            pipeline,
            initial_types=inputs,
            options=_converter_options(pipeline),
            target_opset=TARGET_OPSET,
        )
    # skl2onnx collects opset domains in a set, whose order changes with Python's string hashing
    # from one process to the next; sorting makes the same seed give a byte-identical file.
    opsets = sorted(model.opset_import, key=lambda o: o.domain)
    del model.opset_import[:]
    model.opset_import.extend(opsets)
    return model.SerializeToString()


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
        "inputs": list(MODEL_INPUTS),
        "output": OUTPUT,
    }
    metadata_path(path).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta
