"""Score requests with the exported classifier. Request path: numpy + onnxruntime only.

    scorer = DifficultyScorer.load(None)          # shipped default, or a path to an .onnx file
    scorer.score_request({"messages": [...]})     # -> float in [0, 1], "needs the large tier"
    scorer.score_texts(["prompt", ...])           # -> np.ndarray of scores (batched)

Everything that can go wrong with the model file goes wrong in `load` (ModelLoadError naming the
file), never at the first request: the session is created and run once on a probe input there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from classifiers.features import (
    MODEL_INPUTS,
    TEXT_INPUTS,
    char_ids,
    clean_text,
    is_multiple_choice,
    model_inputs,
    request_text,
)

DEFAULT_MODEL = Path(__file__).resolve().parent / "default" / "model.onnx"
# Rows per onnxruntime call: the graph builds a dense [rows, vocabulary] matrix, so chunks keep
# memory bounded and cache-friendly.
BATCH_ROWS = 512


class ModelLoadError(RuntimeError):
    """The model file is missing, unreadable, or not a classifier this code can run."""


def _session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    # One thread: scoring runs inside a busy proxy, and a single prompt is too small to split.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class DifficultyScorer:
    """A loaded classifier; thread-safe (onnxruntime sessions may be run concurrently)."""

    def __init__(
        self, session: ort.InferenceSession, path: Path, metadata: dict[str, Any]
    ) -> None:
        self.path = path
        self.metadata = metadata
        self.context_turns = int(metadata.get("context_turns", 2))
        self._session = session
        outputs = [o.name for o in session.get_outputs()]
        self._output = "probabilities" if "probabilities" in outputs else outputs[-1]
        # Score = class probabilities @ class values (binary models: P(class 1)).
        values = metadata.get("class_values", [0.0, 1.0])
        self._class_values = np.asarray(values, dtype=np.float32)
        # Current models take text as character ids; models exported before that take strings.
        self._ids = {i.name: i.type == "tensor(int64)" for i in session.get_inputs()}

    @classmethod
    def load(cls, path: str | Path | None = None, threads: int = 1) -> DifficultyScorer:
        """Load an .onnx classifier (None = the shipped default) and check it scores a probe."""
        model_path = Path(path) if path is not None else DEFAULT_MODEL
        if not model_path.is_file():
            raise ModelLoadError(f"classifier model {model_path}: no such file")
        try:
            session = _session(model_path, threads)
        except Exception as exc:  # onnxruntime raises several unrelated types for bad files
            raise ModelLoadError(
                f"classifier model {model_path}: not a loadable ONNX model ({exc})"
            ) from exc
        expected = set(MODEL_INPUTS)
        names = {i.name for i in session.get_inputs()}
        if names != expected:
            raise ModelLoadError(
                f"classifier model {model_path}: inputs {sorted(names)} do not match this "
                f"code's features {sorted(expected)}"
            )
        scorer = cls(session, model_path, _metadata(model_path))
        try:
            probe = scorer.score_texts(["probe: is this model able to score?"])
        except Exception as exc:
            raise ModelLoadError(f"classifier model {model_path}: failed to score ({exc})") from exc
        if not np.isfinite(probe).all():
            raise ModelLoadError(f"classifier model {model_path}: produced a non-finite score")
        return scorer

    def score_request(self, body: Mapping[str, Any], context_turns: int | None = None) -> float:
        """Score one OpenAI chat (`messages`) or completions (`prompt`) body."""
        turns = self.context_turns if context_turns is None else context_turns
        return float(self.score_texts([request_text(body, turns)])[0])

    def score_texts(self, texts: Sequence[str | bytes]) -> np.ndarray:
        """Scores in [0, 1] for raw prompt texts, in order (float64 array)."""
        scores = np.empty(len(texts), dtype=np.float64)
        if len(texts) <= BATCH_ROWS:
            if len(texts):
                scores[:] = self._run(texts)
            return scores
        # Each text input is padded to its chunk's longest prompt, and a prompt fills only one of
        # the two (multiple-choice or open): chunks of one kind and similar lengths waste little.
        kinds = [is_multiple_choice(clean_text(t)) for t in texts]
        lengths = np.fromiter(map(len, texts), np.int64, len(texts))
        order = np.lexsort((lengths, np.asarray(kinds, dtype=bool)))
        for start in range(0, len(texts), BATCH_ROWS):
            rows = order[start : start + BATCH_ROWS]
            scores[rows] = self._run([texts[i] for i in rows])
        return scores

    def _run(self, texts: Sequence[str | bytes]) -> np.ndarray:
        columns = model_inputs(texts)
        feed: dict[str, np.ndarray] = {}
        for name, values in columns.items():
            if name in TEXT_INPUTS and self._ids.get(name):
                feed[name] = char_ids(values)
            elif name in TEXT_INPUTS:
                feed[name] = np.asarray(values, dtype=object).reshape(-1, 1)
            else:
                feed[name] = values.reshape(-1, 1)
        probabilities = self._session.run([self._output], feed)[0]
        if probabilities.shape[1] != len(self._class_values):
            raise ValueError(
                f"model gives {probabilities.shape[1]} classes, metadata names "
                f"{len(self._class_values)} class values"
            )
        # float32 probabilities can sum to 1 + 1e-7; traces require scores within [0, 1].
        return np.clip(probabilities @ self._class_values, 0.0, 1.0)


def _metadata(model_path: Path) -> dict[str, Any]:
    meta_path = model_path.with_suffix(".json")
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"classifier metadata {meta_path}: unreadable ({exc})") from exc
    if not isinstance(meta, dict):
        raise ModelLoadError(f"classifier metadata {meta_path}: expected a JSON object")
    return meta
