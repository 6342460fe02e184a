"""Streaming replay of huge Parquet traces in bounded memory (pyarrow record batches).

Per batch: score the batch's distinct prompts (cached across batches), decide with the policy's
decide_batch, and add to running totals: requests, tier counts, cost, quality, spend per team, and
a threshold sweep (its sums add up across batches, so the curve needs no second pass).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backends.config import Price
from policies.base import Policy
from simulations.context_fit import fit_records, has_windows, moved_off_outcomes, record_tokens
from simulations.parquet_io import TraceBatch, iter_batches
from simulations.replay import (
    ReplayError,
    TierPrices,
    decide,
    fitted_sides,
    pick_policy,
    role_costs,
)
from simulations.sim_config import SimConfig
from simulations.sweep import SortedInputs, SweepInputs, default_thresholds
from simulations.trace import LARGE, SMALL, TraceError

Scorer = Callable[[Sequence[str]], np.ndarray]


class ScoreCache:
    """Scores by prompt text: a trace repeats prompts, so each distinct one is scored once."""

    def __init__(self, score_texts: Scorer) -> None:
        self._score = score_texts
        self._cache: dict[str, float] = {}

    def dictionary_scores(self, prompts: list[str]) -> np.ndarray:
        todo = [p for p in dict.fromkeys(prompts) if p not in self._cache]
        if todo:
            self._cache.update(zip(todo, self._score(todo).tolist(), strict=True))
        return np.fromiter((self._cache[p] for p in prompts), dtype=np.float64, count=len(prompts))


@dataclass
class StreamTotals:
    tiers: list[str]
    thresholds: np.ndarray
    requests: int = 0
    tier_counts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cost_usd: float = 0.0
    quality_sum: float = 0.0
    team_cost: dict[str, float] = field(default_factory=dict)
    sweep_quality: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sweep_cost: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sweep_large: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # With context windows (simulations/context_fit.py): records moved, and refused (no tier
    # holds them: not in tier_counts, no cost, quality 0); None without windows.
    context_moved: int | None = None
    context_refused: int | None = None

    def summary(self) -> dict[str, object]:
        n = max(self.requests, 1)
        out: dict[str, object] = {
            "requests": self.requests,
            "share": {t: float(c / n) for t, c in zip(self.tiers, self.tier_counts, strict=True)},
            "cost_usd": self.cost_usd,
            "cost_per_1k": self.cost_usd / n * 1000,
            "quality": self.quality_sum / n,
            "team_cost_usd": dict(sorted(self.team_cost.items())),
        }
        if self.context_moved is not None:
            out["context_window_moved"] = self.context_moved
            out["context_window_refused"] = self.context_refused
        return out

    def sweep_rows(self) -> list[dict[str, float]]:
        n = max(self.requests, 1)
        return [
            {
                "threshold": float(t),
                "large_share": float(s / n),
                "quality": float(q / n),
                "cost_per_1k": float(c / n * 1000),
            }
            for t, s, q, c in zip(
                self.thresholds, self.sweep_large, self.sweep_quality, self.sweep_cost, strict=True
            )
        ]


def _add_sweep(
    tot: StreamTotals, scores: np.ndarray, quality: np.ndarray, cost: np.ndarray
) -> None:
    s = SortedInputs.build(
        SweepInputs(scores, quality[:, SMALL], quality[:, LARGE], cost[:, SMALL], cost[:, LARGE])
    )
    split, q, c = s.sums_at(tot.thresholds)
    tot.sweep_quality += q
    tot.sweep_cost += c
    tot.sweep_large += scores.shape[0] - split


@dataclass(frozen=True)
class Windows:
    """The context-window rule's inputs: each tier's window, the policy's tiers and prices."""

    windows: Mapping[str, int | None]
    candidates: Mapping[str, Price]


def _add_batch(
    tot: StreamTotals,
    b: TraceBatch,
    scores: np.ndarray,
    policy: Policy,
    prices: TierPrices,
    windows: Windows | None = None,
) -> None:
    # Without an id column, file row numbers: the units an in-memory replay of the file uses.
    units = b.ids if b.ids is not None else [str(b.start + i) for i in range(len(b))]
    tier_idx, role = decide(policy, scores, prices, lambda i: f"record {b.start + i}", units)
    rows = np.arange(len(b))
    cost = prices.cost(tier_idx, b.prompt_tokens, b.completion_tokens)
    quality = b.quality[rows, role]
    served = np.ones(len(b), dtype=bool)
    sweep_quality = b.quality
    sweep_cost = role_costs(prices, b.prompt_tokens, b.completion_tokens)
    if windows is not None:
        tokens = record_tokens(b.prompt_tokens, b.completion_tokens)
        fitted = fit_records(prices.names, tier_idx, tokens, windows.windows, windows.candidates)
        if (off := moved_off_outcomes(prices.names, prices.role, fitted)) is not None:
            raise ReplayError(f"record {b.start + off[0]}: {off[1]}")
        landed = prices.role[fitted.tier_idx]
        tier_idx, served = fitted.tier_idx, ~fitted.refused
        cost = np.where(served, prices.cost(tier_idx, b.prompt_tokens, b.completion_tokens), 0.0)
        quality = np.where(served, b.quality[rows, np.maximum(landed, 0)], 0.0)
        sides = (prices.names[prices.role_tier(SMALL)], prices.names[prices.role_tier(LARGE)])
        sweep_quality, sweep_cost = fitted_sides(
            prices, windows.candidates, tokens, sides, windows.windows, b.quality, sweep_cost
        )
        tot.context_moved = (tot.context_moved or 0) + int(fitted.moved.sum())
        tot.context_refused = (tot.context_refused or 0) + int(fitted.refused.sum())
    tot.requests += len(b)
    tot.tier_counts += np.bincount(tier_idx[served], minlength=len(prices.names))
    tot.cost_usd += float(cost.sum())
    tot.quality_sum += float(np.nansum(quality))
    per_team = np.bincount(b.team_idx, weights=cost, minlength=len(b.teams))
    for name, v in zip(b.teams, per_team.tolist(), strict=True):
        tot.team_cost[name] = tot.team_cost.get(name, 0.0) + v
    _add_sweep(tot, scores, sweep_quality, sweep_cost)


def stream_replay(
    sim: SimConfig,
    path: str | Path,
    score_texts: Scorer,
    policy_name: str | None = None,
    batch_rows: int = 262_144,
    thresholds: np.ndarray | None = None,
    use_recorded: bool = False,
) -> StreamTotals:
    policy = pick_policy(sim, policy_name)
    prices = TierPrices.from_prices(sim.prices)
    th = default_thresholds() if thresholds is None else thresholds
    tot = StreamTotals(
        tiers=prices.names,
        thresholds=th,
        tier_counts=np.zeros(len(prices.names), dtype=np.int64),
        sweep_quality=np.zeros(th.shape[0]),
        sweep_cost=np.zeros(th.shape[0]),
        sweep_large=np.zeros(th.shape[0], dtype=np.int64),
    )
    cache = ScoreCache(score_texts)
    windows = None
    if has_windows(sim.context_windows, policy.tiers()):
        candidates = {t: sim.prices[t] for t in policy.tiers()}
        windows = Windows(sim.context_windows, candidates)
    for b in iter_batches(path, batch_rows):
        if use_recorded:
            if b.score is None:
                raise TraceError(f"{path}: no 'score' column to use (drop --recorded-scores)")
            scores = b.score
        else:
            scores = cache.dictionary_scores(b.prompts)[b.prompt_idx]
        _add_batch(tot, b, scores, policy, prices, windows)
    return tot
