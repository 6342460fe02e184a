"""Rebuild the shipped model from its metadata and check it: byte-identical ONNX (reproducible
from the seed) and onnxruntime == scikit-learn on every prompt of the shared data.

    .venv/bin/python benchmarks/classifier_parity.py [--data DIR] [--write DIR]

`--write DIR` keeps the rebuilt model (model.onnx and its metadata files) in DIR: how the shipped
model is rebuilt when only its graph changes (classifiers/export.py), its fit and scores not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from classifiers.config import DEFAULT_MODEL  # noqa: E402
from classifiers.dataset import load_dataset, routellm_data_dir  # noqa: E402
from classifiers.export import export, metadata_for  # noqa: E402
from classifiers.inference import DifficultyScorer  # noqa: E402
from classifiers.train import TrainConfig, fit, frame, predict_scores  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(routellm_data_dir()))
    parser.add_argument("--write", type=Path, help="keep the rebuilt model in this folder")
    args = parser.parse_args()
    shipped = json.loads(DEFAULT_MODEL.with_suffix(".json").read_text())
    saved = dict(shipped["train_config"])
    saved["char_ngrams"] = tuple(saved["char_ngrams"])
    saved["char_sides"] = tuple(saved["char_sides"])
    saved.setdefault("prior_tol", 1e-4)  # saved before the field: scikit-learn's default then
    config = TrainConfig(**saved)
    dataset = load_dataset(args.data)
    pipeline = fit(dataset, config)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.write or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "model.onnx"
        export(pipeline, path, metadata_for(dataset, config, pipeline, [Path(args.data)]))
        identical = path.read_bytes() == DEFAULT_MODEL.read_bytes()
        rebuilt_scores = DifficultyScorer.load(path).score_texts(dataset.prompts)
    onnx_scores = DifficultyScorer.load(None).score_texts(dataset.prompts)
    sk_scores = predict_scores(pipeline, frame(dataset.prompts))
    diff = np.abs(onnx_scores - sk_scores)
    print(f"rebuilt model byte-identical to shipped: {identical}")
    moved = np.abs(rebuilt_scores - onnx_scores)
    print(f"rebuilt vs shipped scores: max |diff| = {moved.max():.3g}")
    print(
        f"prompts compared: {len(diff)}; max |onnx - sklearn| = {diff.max():.3g}; "
        f"over 1e-5: {(diff > 1e-5).sum()}"
    )


if __name__ == "__main__":
    main()
