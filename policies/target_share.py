"""Thresholds given as a target share of large-tier traffic.

"Send 30% of traffic to the large tier" becomes a score threshold through the classifier's score
distribution on a reference trace: the threshold is the score that the top 30% reach. The
conversion is logged so operators can see which number is really in force.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

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


def _records(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with path.open("rb") as fh:
            for line_no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ReferenceTraceError(f"{path}:{line_no}: not JSON ({exc})") from None
    except OSError as exc:
        raise ReferenceTraceError(f"cannot read reference trace {path}: {exc.strerror}") from None


def _body(record: dict[str, Any]) -> dict[str, Any] | None:
    if record.get("messages"):
        return {"messages": record["messages"]}
    if record.get("prompt"):
        return {"messages": [{"role": "user", "content": record["prompt"]}]}
    return None


def load_reference_scores(path: str | Path, model_path: str | None = None,
                          rescore: bool = False) -> np.ndarray:
    """Scores of a trace: its recorded `score` fields, or (rescore) the configured classifier's
    scores of its `prompt`/`messages`, for when the recorded ones came from an older model."""
    p = Path(path)
    if not rescore:
        scores = [r["score"] for r in _records(p) if isinstance(r.get("score"), int | float)]
    else:
        from classifiers.inference import DifficultyScorer

        scorer = DifficultyScorer.load(model_path)
        scores = [scorer.score_request(b) for r in _records(p) if (b := _body(r)) is not None]
    if not scores:
        what = "prompts or messages" if rescore else "score fields"
        raise ReferenceTraceError(f"reference trace {p} has no {what}")
    return np.asarray(scores, dtype=np.float64)


def convert_share(policy: str, share: float, scores: np.ndarray, source: str) -> float:
    """Threshold for `share`, logged with the share it really gives on the reference scores."""
    t = threshold_for_share(scores, share)
    log.info(
        "policy %s: target large share %.4f -> threshold %.6f (achieves %.4f on %d scores from %s)",
        policy, share, t, achieved_share(scores, t), len(scores), source,
    )
    return t
