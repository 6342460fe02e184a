"""Training labels: which prompts "need the large tier".

Default binary label (`needs_large`): the large model's outcome beats the small model's by more
than `margin`. With True/False outcomes and margin 0 that is "large right, small wrong"; with
graded outcomes (e.g. 1-10 judge scores) a margin ignores differences a judge cannot resolve.

Rows where either outcome is unknown (NaN) get no label; callers drop them.
"""

from __future__ import annotations

import numpy as np


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


def gain_class(small: np.ndarray, large: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """-1 where large is worse by more than `margin`, 1 where better by more, else 0 (a tie).

    The shipped model learns these three classes and scores P(1) - P(-1), the expected gain of
    sending the prompt to the large model: prompts where only the small model is right are pushed
    to the bottom of the ranking, not lumped in with ties as the binary label does.
    """
    better = needs_large(small, large, margin)
    worse = needs_large(large, small, margin)
    return better - worse
