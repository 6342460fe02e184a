"""Context windows in a replay: every record goes through the proxy's rule,
policies/context_window.py `fit_tier` (called, not copied), once per distinct (tier, tokens).

What a record needs is read from the trace: its prompt tokens plus the longer of its answers
(the completion count of either outcome role). The proxy judges a live request by upper bounds
(the reservation's prompt estimate and max_tokens), which are never below these counts, so the
replay moves or refuses at most the records the proxy did: a record the proxy moved on the
strength of its estimate alone may stay put here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from backends.config import Price
from policies.context_window import fit_tier


@dataclass(frozen=True)
class Fitted:
    """The tiers after the rule (config order) and the records no candidate tier holds."""

    tier_idx: np.ndarray  # (n,) int64, into the config's tier names
    moved: np.ndarray  # (n,) bool: the chosen tier could not hold it
    refused: np.ndarray  # (n,) bool: no candidate could (the proxy's 400)


def record_tokens(prompt_tokens: np.ndarray, completion_tokens: np.ndarray) -> np.ndarray:
    """(n,) tokens each record needs of a context window: prompt + its longest answer."""
    completion = np.asarray(completion_tokens)
    longest = completion.max(axis=1) if completion.ndim == 2 else completion
    return np.asarray(prompt_tokens, dtype=np.int64) + np.asarray(longest, dtype=np.int64)


def has_windows(windows: Mapping[str, int | None], tiers: Sequence[str]) -> bool:
    return any(windows.get(t) is not None for t in tiers)


def fit_records(
    names: Sequence[str],
    tier_idx: np.ndarray,
    tokens: np.ndarray,
    windows: Mapping[str, int | None],
    candidates: Mapping[str, Price],
) -> Fitted:
    """Each record's tier after the context-window rule: `tier_idx` (config order, into `names`)
    as the policy chose, `candidates` the policy's tiers and their prices (what the proxy moves a
    request to, cheapest first)."""
    tier_idx = np.asarray(tier_idx, dtype=np.int64)
    n = tier_idx.shape[0]
    out, refused = tier_idx.copy(), np.zeros(n, dtype=bool)
    if n == 0:
        return Fitted(out, np.zeros(n, dtype=bool), refused)
    index = {name: i for i, name in enumerate(names)}
    tokens = np.asarray(tokens, dtype=np.int64)
    pairs, inverse = np.unique(np.stack([tier_idx, tokens], axis=1), axis=0, return_inverse=True)
    landed = np.empty(pairs.shape[0], dtype=np.int64)
    for k, (chosen, need) in enumerate(pairs.tolist()):
        tier = fit_tier(names[chosen], need, windows, candidates)
        landed[k] = -1 if tier is None else index[tier]
    result = landed[inverse.reshape(-1)]
    refused = result < 0
    out[~refused] = result[~refused]
    return Fitted(out, out != tier_idx, refused)


def moved_off_outcomes(
    names: Sequence[str], role: np.ndarray, fitted: Fitted
) -> tuple[int, str] | None:
    """The first record the window moved to a tier the trace has no outcomes for (role < 0),
    and what to say of it; None when every move landed on a tier with outcomes. The caller
    names the record (in memory: its trace row; streamed: its position)."""
    bad = fitted.moved & (role[fitted.tier_idx] < 0)
    if not bad.any():
        return None
    i = int(np.flatnonzero(bad)[0])
    return i, (
        f"its context window moved it to tier {names[fitted.tier_idx[i]]!r}, but the trace "
        "has outcomes only for the cheapest and the priciest tier"
    )
