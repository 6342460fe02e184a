"""Training labels: which prompts "need the large tier".

Default (`needs_large`): the large model's outcome beats the small model's by more than `margin`.
With True/False outcomes and margin 0 that is "large right, small wrong"; with graded outcomes
(e.g. 1-10 judge scores) a margin ignores differences a judge cannot resolve.

Rows where either outcome is unknown (NaN) get no label; callers drop them.
"""

from __future__ import annotations

import numpy as np

LABELS = ("large_beats_small",)


def needs_large(small: np.ndarray, large: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """1 where large - small > margin, else 0 (int array, same length)."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    small = np.asarray(small, dtype=np.float64)
    large = np.asarray(large, dtype=np.float64)
    if small.shape != large.shape:
        raise ValueError(f"outcome arrays differ in shape: {small.shape} vs {large.shape}")
    return ((large - small) > margin).astype(np.int64)


def known(small: np.ndarray, large: np.ndarray) -> np.ndarray:
    """Rows whose two outcomes are both known."""
    return ~(np.isnan(np.asarray(small, float)) | np.isnan(np.asarray(large, float)))
