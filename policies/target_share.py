"""Thresholds given as a target share of large-tier traffic.

"Send 30% of traffic to the large tier" becomes a score threshold through the classifier's score
distribution on a reference trace: the threshold is the score that the top 30% reach. The
conversion is logged so operators can see which number is really in force.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from trace_format.reader import TraceFormatError, iter_lines

log = logging.getLogger("cost_router.policies")


class ReferenceTraceError(ValueError):
    """The reference trace cannot be read or has no usable scores."""


def threshold_for_share(scores: np.ndarray, share: float) -> float:
    """Smallest threshold t with round(share * n) of the scores >= t (ties can add a few more)."""
    values = np.sort(np.asarray(scores, dtype=np.float64))
    n = len(values)
    if n == 0:
        raise ReferenceTraceError("no scores to convert a target share")
    k = int(round(share * n))
    if k <= 0:
        # Above every reference score: nothing goes large.
        return float(np.nextafter(values[-1], np.inf))
    return float(values[n - min(k, n)])


def achieved_share(scores: np.ndarray, threshold: float) -> float:
    values = np.asarray(scores, dtype=np.float64)
    return float(np.mean(values >= threshold)) if len(values) else 0.0


def _request_body(record: dict[str, Any]) -> dict[str, Any] | None:
    """A trace record's content as the request body it came from (chat `messages` or a
    completions `prompt`), scored the way the proxy scores a request
    (trace_format/request_text.py)."""
    if record.get("messages"):
        return {"messages": record["messages"]}
    if record.get("prompt"):
        return {"prompt": record["prompt"]}
    return None


def _lines(path: str | Path) -> list[dict[str, Any]]:
    try:
        return [data for _, data in iter_lines(path)]
    except TraceFormatError as exc:
        raise ReferenceTraceError(str(exc)) from None


def load_reference_scores(
    path: str | Path, model_path: str | None = None, rescore: bool = False
) -> np.ndarray:
    """Scores of a trace: its recorded `score` fields, or (rescore) the configured classifier's
    scores of its `prompt`/`messages`, for when the recorded ones came from an older model."""
    records = _lines(path)
    if not rescore:
        scores = [r["score"] for r in records if isinstance(r.get("score"), int | float)]
    else:
        # Imported here, not at the top: onnxruntime (which classifiers.inference loads) is needed
        # only by a policy that rescores, not whenever a config is checked or policies are built
        # (`config check`, the simulator, the budget commands).
        from classifiers.inference import DifficultyScorer

        scorer = DifficultyScorer.load(model_path)
        scores = [scorer.score_request(b) for r in records if (b := _request_body(r)) is not None]
    if not scores:
        what = "prompts or messages" if rescore else "score fields"
        raise ReferenceTraceError(f"reference trace {path} has no {what}")
    return np.asarray(scores, dtype=np.float64)


def convert_share(policy: str, share: float, scores: np.ndarray, source: str) -> float:
    """Threshold for `share`, logged with the share it really gives on the reference scores."""
    t = threshold_for_share(scores, share)
    log.info(
        "policy %s: target large share %.4f -> threshold %.6f (achieves %.4f on %d scores from %s)",
        policy,
        share,
        t,
        achieved_share(scores, t),
        len(scores),
        source,
    )
    return t
