"""scikit-learn pipeline -> ONNX (skl2onnx) + a metadata JSON next to it. Offline only."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType, Int64TensorType
from sklearn.pipeline import Pipeline

from classifiers.features import MODEL_INPUTS, NUMERIC_INPUTS, TEXT_INPUTS
from classifiers.id_converter import register
from classifiers.train import class_values

TARGET_OPSET = 18
OUTPUT = "probabilities"


def metadata_path(model_path: str | Path) -> Path:
    return Path(model_path).with_suffix(".json")


def to_onnx_bytes(pipeline: Pipeline) -> bytes:
    # Text columns arrive as character ids (classifiers.features.char_ids), [rows, width]. They are
    # declared [rows, 1] so that skl2onnx's ColumnTransformer hands each one whole to its
    # vectorizers (it slices inputs wider than the columns it selects); widened below.
    register()
    inputs: list[tuple[str, Any]] = [(name, Int64TensorType([None, 1])) for name in TEXT_INPUTS]
    inputs += [(name, FloatTensorType([None, 1])) for name in NUMERIC_INPUTS]
    model = to_onnx(
        pipeline,
        initial_types=inputs,
        options={id(pipeline.steps[-1][1]): {"zipmap": False}},
        target_opset=TARGET_OPSET,
    )
    for graph_input in model.graph.input:
        if graph_input.name in TEXT_INPUTS:
            width = graph_input.type.tensor_type.shape.dim[1]
            width.ClearField("dim_value")
            width.dim_param = "chars"
    del model.graph.value_info[:]
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
