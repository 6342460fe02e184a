"""Score requests with the exported classifier. Request path: numpy + onnxruntime only.

    scorer = DifficultyScorer.load(None)          # shipped default, or a path to an .onnx file
    scorer.score_request({"messages": [...]})     # -> float in [0, 1], "needs the large tier"
    scorer.score_texts(["prompt", ...])           # -> np.ndarray of scores (batched)

Everything that can go wrong with the model file goes wrong in `load` (ModelLoadError naming the
file), never at the first request: the session is created and run once on a probe input there.
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from classifiers.features import (
    BROADCAST_KEY,
    MODEL_INPUTS,
    NUMERIC_INPUT,
    PACKED_INPUTS,
    TEXT_INPUTS,
    clean_text,
    is_multiple_choice,
    model_feed,
)
from classifiers.model_files import ModelFiles, model_file
from trace_format.request_text import request_text

# Rows per onnxruntime call: the graph builds a dense [rows, vocabulary] matrix, so chunks keep
# memory bounded and cache-friendly.
BATCH_ROWS = 512
# ... and at most this many padded characters (rows x longest prompt of the chunk).
BATCH_CELLS = 512 * 640
# Batches up to this size run as one call; bigger ones are split by kind and length.
SMALL_BATCH = 16
# score_request keeps the scores of this many recent request texts of at most CACHED_CHARS
# characters (<= 2048 x 2048 characters held). The scored text is the last user turn and the two
# turns before it, so every step of an agent's tool loop (tool results are not user turns), a
# retry and a repeated short prompt ("hello") score the same text again: a hit costs a dict
# lookup instead of a run, which is a few hundred microseconds once the model's weights have left
# the CPU's cache between requests. A score depends on the text only, so a hit is exact.
CACHED_TEXTS = 2048
CACHED_CHARS = 2048


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

    def __init__(self, session: ort.InferenceSession, path: Path, metadata: dict[str, Any]) -> None:
        self.path = path
        # Big batches: overlap Python preprocessing with onnxruntime (see score_texts).
        self.overlap = True
        self.metadata = metadata
        self.context_turns = int(metadata.get("context_turns", 2))
        self._session = session
        outputs = [o.name for o in session.get_outputs()]
        self._output = "probabilities" if "probabilities" in outputs else outputs[-1]
        # Score = class probabilities @ class values (binary models: P(class 1)).
        values = metadata.get("class_values", [0.0, 1.0])
        self._class_values = np.asarray(values, dtype=np.float32)
        # Current models take text as character ids; models exported before that take strings.
        types = {i.name: i.type for i in session.get_inputs()}
        self._ids = all(types.get(name) == "tensor(int64)" for name in TEXT_INPUTS)
        # Lean graphs (classifiers.export) accept one padding row for a text input empty in every
        # row of a batch, and then skip that input's n-gram work.
        props = session.get_modelmeta().custom_metadata_map
        self._broadcast = props.get(BROADCAST_KEY) == "1"
        # functools' C LRU: thread-safe, one per scorer (a reloaded model starts empty). It holds
        # the scorer weakly: no reference cycle keeps a replaced model's session alive until the
        # garbage collector runs.
        scorer = weakref.ref(self)
        self._cached_score = functools.lru_cache(maxsize=CACHED_TEXTS)(
            lambda text: _alive(scorer).score_text(text)
        )
        # Current models take the numeric features as one input; older ones one input each.
        self._packed = NUMERIC_INPUT in types

    @classmethod
    def load(cls, path: str | Path | None = None, threads: int = 1) -> DifficultyScorer:
        """Load an .onnx classifier (None = the shipped default) and check it scores a probe."""
        model_path = model_file(path)
        if not model_path.is_file():
            raise ModelLoadError(f"classifier model {model_path}: no such file")
        try:
            session = _session(model_path, threads)
        except Exception as exc:  # onnxruntime raises several unrelated types for bad files
            raise ModelLoadError(
                f"classifier model {model_path}: not a loadable ONNX model ({exc})"
            ) from exc
        names = {i.name for i in session.get_inputs()}
        if names not in (set(PACKED_INPUTS), set(MODEL_INPUTS)):
            raise ModelLoadError(
                f"classifier model {model_path}: inputs {sorted(names)} do not match this "
                f"code's features {sorted(PACKED_INPUTS)} (or, exported before, "
                f"{sorted(MODEL_INPUTS)})"
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
        text = request_text(body, turns)
        return self._cached_score(text) if len(text) <= CACHED_CHARS else self.score_text(text)

    def score_requests(
        self, bodies: Sequence[Mapping[str, Any]], context_turns: int | None = None
    ) -> np.ndarray:
        """score_request of each body, in one onnxruntime call (the proxy's batched scoring
        step, router/proxy/score_batch.py): each score equals the one its body gets alone."""
        turns = self.context_turns if context_turns is None else context_turns
        return self.score_texts([request_text(b, turns) for b in bodies], overlap=False)

    def score_text(self, text: str | bytes) -> float:
        """The score of one text: score_texts([text])[0] without the batch bookkeeping."""
        clean = clean_text(text)
        feed = self._feed([clean], [is_multiple_choice(clean)])
        return float(self._scores(self._predict(feed))[0])

    def score_texts(self, texts: Sequence[str | bytes], overlap: bool | None = None) -> np.ndarray:
        """Scores in [0, 1] for raw prompt texts, in order (float64 array).

        A batch of several chunks is scored with `overlap` (default: the scorer's `overlap`):
        Python prepares chunk k+1 while onnxruntime, which releases the GIL, scores chunk k in a
        helper thread; two cores busy instead of one. Same scores either way.
        """
        scores = np.empty(len(texts), dtype=np.float64)
        if not len(texts):
            return scores
        cleans = [clean_text(t) for t in texts]
        kinds = [is_multiple_choice(c) for c in cleans]
        chunks = _chunks(cleans, kinds)
        if len(chunks) == 1 or not (self.overlap if overlap is None else overlap):
            for rows in chunks:
                feed = self._feed([cleans[i] for i in rows], [kinds[i] for i in rows])
                scores[rows] = self._scores(self._predict(feed))
            return scores
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="scorer") as pool:
            pending: tuple[np.ndarray, Future[np.ndarray]] | None = None
            for rows in chunks:
                feed = self._feed([cleans[i] for i in rows], [kinds[i] for i in rows])
                job = pool.submit(self._predict, feed)
                if pending is not None:
                    scores[pending[0]] = self._scores(pending[1].result())
                pending = (rows, job)
            if pending is not None:
                scores[pending[0]] = self._scores(pending[1].result())
        return scores

    def _feed(self, cleans: Sequence[str], kinds: Sequence[bool]) -> dict[str, np.ndarray]:
        return model_feed(
            cleans, kinds, ids=self._ids, one_row_if_empty=self._broadcast, packed=self._packed
        )

    def _predict(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return self._session.run([self._output], feed)[0]

    def _scores(self, probabilities: np.ndarray) -> np.ndarray:
        if probabilities.shape[1] != len(self._class_values):
            raise ValueError(
                f"model gives {probabilities.shape[1]} classes, metadata names "
                f"{len(self._class_values)} class values"
            )
        # float32 probabilities can sum to 1 + 1e-7; traces require scores within [0, 1].
        return np.minimum(np.maximum(probabilities @ self._class_values, 0.0), 1.0)


def _alive(ref: weakref.ref[DifficultyScorer]) -> DifficultyScorer:
    scorer = ref()
    if scorer is None:  # only reachable through a scorer, so never while it is unused
        raise RuntimeError("classifier scorer was garbage-collected")
    return scorer


def _chunks(cleans: Sequence[str], kinds: Sequence[bool]) -> list[np.ndarray]:
    """Row indices per onnxruntime call: a small batch whole, a bigger one by kind and length.

    Each text input is padded to its chunk's longest prompt (padding costs n-gram lookups too),
    and a prompt fills only one of the two (multiple-choice or open): chunks of one kind and
    similar lengths waste little, and the other kind's input shrinks to one row (see model_feed).
    """
    size = len(cleans)
    if size <= SMALL_BATCH:
        return [np.arange(size)]
    lengths = np.fromiter(map(len, cleans), np.int64, size)
    mc = np.asarray(kinds, dtype=bool).reshape(-1)
    chunks = []
    for side in (True, False):
        rows = np.flatnonzero(mc == side)
        rows = rows[np.argsort(lengths[rows], kind="stable")]
        start = 0
        while start < len(rows):
            # Up to BATCH_ROWS rows, fewer where the rows are long (padded cells bounded).
            widest = np.maximum(lengths[rows[start : start + BATCH_ROWS]], 1)
            fits = np.arange(1, len(widest) + 1) * widest <= BATCH_CELLS
            count = max(1, int(np.count_nonzero(fits)))
            chunks.append(rows[start : start + count])
            start += count
    return chunks


def _metadata(model_path: Path) -> dict[str, Any]:
    meta_path = ModelFiles(model_path).card
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"classifier metadata {meta_path}: unreadable ({exc})") from exc
    if not isinstance(meta, dict):
        raise ModelLoadError(f"classifier metadata {meta_path}: expected a JSON object")
    return meta
