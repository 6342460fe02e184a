"""Replay a trace through the real classifier and a configured policy: tier, cost, quality.

Scores come from classifiers.inference (batch ONNX, the same model and text the proxy uses);
decisions from policies.registry.build_policies + the policy's decide_batch, per request id (a
randomised policy draws as the proxy did). Cost is the tier's price x the request's token counts
(backends.config.cost_nanos, the proxy's formula); quality is the chosen tier's recorded outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from backends.config import NANOS_PER_USD, Price, cost_nanos
from classifiers.inference import DifficultyScorer
from policies.base import BatchContext, Policy, Tunable
from policies.calibration import CalibratingPolicy, replay_decisions
from policies.registry import build_policies, tiers_by_price
from simulations.context_fit import (
    Fitted,
    fit_records,
    has_windows,
    moved_off_outcomes,
    record_tokens,
)
from simulations.sim_config import SimConfig
from simulations.sweep import SweepInputs
from simulations.trace import LARGE, SMALL, RecordedCache, ReplayTrace, TraceError


class ReplayError(ValueError):
    """A config/trace combination the simulator cannot replay; the message says which part."""


def score_texts(texts: Sequence[str], model_path: str | None) -> np.ndarray:
    """Classifier scores (float64) for texts; each distinct text is scored once."""
    unique = list(dict.fromkeys(texts))
    scorer = DifficultyScorer.load(model_path)
    by_text = dict(zip(unique, scorer.score_texts(unique).tolist(), strict=True))
    return np.fromiter((by_text[t] for t in texts), dtype=np.float64, count=len(texts))


def trace_scores(
    trace: ReplayTrace, model_path: str | None, use_recorded: bool = False
) -> np.ndarray:
    """Scores for every request: re-scored with the model (None: the shipped one), or the
    trace's own."""
    if use_recorded:
        if trace.scores is None:
            raise TraceError(
                f"{trace.record(0)}: no recorded 'score' column (recorded scores are read from "
                "Parquet traces; JSONL and CSV traces are re-scored)"
            )
        if np.isnan(trace.scores).any():
            i = int(np.flatnonzero(np.isnan(trace.scores))[0])
            raise TraceError(f"{trace.record(i)}: missing field 'score'")
        return trace.scores
    return score_texts(trace.texts, model_path)


@dataclass(frozen=True)
class TierPrices:
    """Tier names in config order, their prices, and which outcome role each tier has."""

    names: list[str]
    input_per_mtok: np.ndarray
    output_per_mtok: np.ndarray
    role: np.ndarray  # SMALL for the cheapest tier, LARGE for the priciest, -1 for others
    # Cache prices, NaN where the tier sets none (its cached tokens are then priced as fresh,
    # as the proxy's Price does).
    cached_input_per_mtok: np.ndarray | None = None
    cache_write_per_mtok: np.ndarray | None = None

    @classmethod
    def from_prices(cls, prices: Mapping[str, Price]) -> TierPrices:
        order = tiers_by_price(prices)
        role = {order[0]: SMALL, order[-1]: LARGE} if len(order) > 1 else {order[0]: SMALL}
        names = list(prices)
        return cls(
            names=names,
            input_per_mtok=np.asarray([prices[t].input_per_mtok for t in names]),
            output_per_mtok=np.asarray([prices[t].output_per_mtok for t in names]),
            role=np.asarray([role.get(t, -1) for t in names]),
            cached_input_per_mtok=_optional_prices(
                [prices[t].cached_input_per_mtok for t in names]
            ),
            cache_write_per_mtok=_optional_prices([prices[t].cache_write_per_mtok for t in names]),
        )

    def index(self, tier: str) -> int:
        try:
            return self.names.index(tier)
        except ValueError:
            raise ReplayError(
                f"tier {tier!r} has no price: it is not in the config's tiers"
            ) from None

    def cost(
        self,
        tier_idx: np.ndarray,
        prompt_tokens: np.ndarray,
        completion_tokens: np.ndarray,
        cache: RecordedCache | None = None,
    ) -> np.ndarray:
        """USD per request when request i is served by tier tier_idx[i].

        completion_tokens is (n, 2), per outcome role; a tier uses its own role's count.
        `cache`: the trace's prompt-cache breakdown, priced on the tier that recorded it."""
        role = np.maximum(self.role[tier_idx], 0)
        completion = completion_tokens[np.arange(tier_idx.shape[0]), role]
        inp, out = self.input_per_mtok[tier_idx], self.output_per_mtok[tier_idx]
        # The proxy's formula (whole nano-USD), so replayed costs equal the traced ones exactly.
        unpriced = self.cached_input_per_mtok is None and self.cache_write_per_mtok is None
        if cache is None or unpriced:
            nanos = cost_nanos(inp, out, prompt_tokens, completion)
        else:
            cached, written = cache.on(np.asarray(self.names, dtype=object)[tier_idx])
            none = np.full(len(self.names), np.nan)
            cached_price = _or(self.cached_input_per_mtok, none)[tier_idx]
            write_price = _or(self.cache_write_per_mtok, none)[tier_idx]
            # A tier without a cache price prices those tokens as fresh (cost_nanos's None).
            cached = np.where(np.isnan(cached_price), 0, cached)
            written = np.where(np.isnan(write_price), 0, written)
            nanos = cost_nanos(
                inp,
                out,
                prompt_tokens,
                completion,
                cached,
                written,
                np.nan_to_num(cached_price),
                np.nan_to_num(write_price),
            )
        return np.asarray(nanos, dtype=np.float64) / NANOS_PER_USD

    def role_tier(self, role: int) -> int:
        """Config index of the tier that has this outcome role."""
        return int(np.flatnonzero(self.role == role)[0])


def _or(prices: np.ndarray | None, default: np.ndarray) -> np.ndarray:
    return default if prices is None else prices


def _optional_prices(values: list[float | None]) -> np.ndarray | None:
    if all(v is None for v in values):
        return None  # no tier sets one: the two-term formula, as before cache prices
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)


def role_costs(
    prices: TierPrices,
    prompt_tokens: np.ndarray,
    completion_tokens: np.ndarray,
    cache: RecordedCache | None = None,
) -> np.ndarray:
    """(n, 2) cost per request if served by the small-role / the large-role tier."""
    n = prompt_tokens.shape[0]
    return np.stack(
        [
            prices.cost(np.full(n, prices.role_tier(r)), prompt_tokens, completion_tokens, cache)
            for r in (SMALL, LARGE)
        ],
        axis=1,
    )


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    tiers: list[str]  # config order
    tier_idx: np.ndarray  # per request, into `tiers`
    cost_usd: np.ndarray
    quality: np.ndarray  # NaN where the chosen tier's outcome is unknown
    scores: np.ndarray
    # With context windows configured (simulations/context_fit.py): records moved off the chosen
    # tier, and records no tier holds (the proxy's 400: no tier, no cost, quality 0 as an
    # answer never given, as in tune's sweep).
    moved: np.ndarray | None = None
    refused: np.ndarray | None = None

    def summary(self) -> dict[str, object]:
        n = self.tier_idx.shape[0]
        served = self.tier_idx if self.refused is None else self.tier_idx[~self.refused]
        counts = np.bincount(served, minlength=len(self.tiers))
        known = ~np.isnan(self.quality)
        out: dict[str, object] = {
            "policy": self.policy,
            "requests": int(n),
            "share": {t: float(c / n) for t, c in zip(self.tiers, counts, strict=True)},
            "cost_usd": float(self.cost_usd.sum()),
            "cost_per_1k": float(self.cost_usd.mean() * 1000),
            "quality": float(self.quality[known].mean()) if known.any() else None,
            "quality_known": int(known.sum()),
        }
        if self.moved is not None and self.refused is not None:
            out["context_window_moved"] = int(self.moved.sum())
            out["context_window_refused"] = int(self.refused.sum())
        return out


def pick_policy(sim: SimConfig, name: str | None) -> Policy:
    policies = build_policies(sim.policies, sim.env)
    key = name or sim.default_policy
    if key not in policies:
        raise ReplayError(f"unknown policy {key!r} (configured: {', '.join(sorted(policies))})")
    return policies[key]


def decide(
    policy: Policy,
    scores: np.ndarray,
    prices: TierPrices,
    record: Callable[[int], str],
    units: Sequence[str],
) -> tuple[np.ndarray, np.ndarray]:
    """Config-order tier index and outcome role per request, from the policy's decide_batch.

    `units` are the requests' ids, so a randomised policy draws as the proxy did for them."""
    ctx = BatchContext(units=units)
    if isinstance(policy, CalibratingPolicy):
        # Calibration is sequential: each request is decided at the threshold in force then.
        local = replay_decisions(policy, scores, ctx).tier_idx
    else:
        local = np.asarray(policy.decide_batch(scores, ctx), dtype=np.int64)
    to_config = np.asarray([prices.index(t) for t in policy.tiers()], dtype=np.int64)
    tier_idx = to_config[local]
    role = prices.role[tier_idx]
    if (role < 0).any():
        i = int(np.flatnonzero(role < 0)[0])
        raise ReplayError(
            f"{record(i)}: policy {policy.name!r} chose tier {prices.names[tier_idx[i]]!r}, "
            "but the trace has outcomes only for the cheapest and the priciest tier"
        )
    return tier_idx, role


def policy_scores(
    sim: SimConfig, trace: ReplayTrace, scores: np.ndarray, policy_name: str | None = None
) -> np.ndarray:
    """The scores the named policy routes by. A policy with its own `model_path` (a canary, an
    A/B arm with a candidate model) is scored by that model, as the proxy scores its requests;
    `scores` are the global model's. Scores the trace itself carries (recorded in it, or read
    from a scores file: `scores is trace.scores`) were chosen by the user and are kept."""
    own = policy_model_path(sim, policy_name)
    if own == sim.model_path or scores is trace.scores:
        return scores
    return score_texts(trace.texts, own)


def policy_model_path(sim: SimConfig, policy_name: str | None = None) -> str | None:
    """The model the named policy routes by: its own `model_path`, else the global one."""
    config = sim.policies.get(policy_name or sim.default_policy)
    own = config.model_path if config is not None else None
    return sim.model_path if own is None else own


def replay(
    sim: SimConfig, trace: ReplayTrace, scores: np.ndarray, policy_name: str | None = None
) -> ReplayResult:
    """`scores`: the global model's (trace_scores); a policy with its own model is re-scored by
    it (policy_scores)."""
    policy = pick_policy(sim, policy_name)
    scores = policy_scores(sim, trace, scores, policy_name)
    prices = TierPrices.from_prices(sim.prices)
    tier_idx, role = decide(policy, scores, prices, trace.record, trace.units())
    rows = np.arange(len(trace))
    if not has_windows(sim.context_windows, policy.tiers()):
        return ReplayResult(
            policy=policy.name,
            tiers=prices.names,
            tier_idx=tier_idx,
            cost_usd=prices.cost(
                tier_idx, trace.prompt_tokens, trace.completion_tokens, trace.cache
            ),
            quality=trace.quality[rows, role],
            scores=scores,
        )
    fitted = context_fit(sim, policy, prices, trace, tier_idx)
    cost = prices.cost(fitted.tier_idx, trace.prompt_tokens, trace.completion_tokens, trace.cache)
    quality = trace.quality[rows, prices.role[fitted.tier_idx]]
    return ReplayResult(
        policy=policy.name,
        tiers=prices.names,
        tier_idx=fitted.tier_idx,
        cost_usd=np.where(fitted.refused, 0.0, cost),
        quality=np.where(fitted.refused, 0.0, quality),
        scores=scores,
        moved=fitted.moved,
        refused=fitted.refused,
    )


def context_fit(
    sim: SimConfig, policy: Policy, prices: TierPrices, trace: ReplayTrace, tier_idx: np.ndarray
) -> Fitted:
    """The policy's choices after the proxy's context-window rule (simulations/context_fit.py);
    a record moved to a tier without outcomes in the trace is an error, as a policy's choice."""
    tokens = record_tokens(trace.prompt_tokens, trace.completion_tokens)
    candidates = {t: sim.prices[t] for t in policy.tiers()}
    fitted = fit_records(prices.names, tier_idx, tokens, sim.context_windows, candidates)
    if (off := moved_off_outcomes(prices.names, prices.role, fitted)) is not None:
        raise ReplayError(f"{trace.record(off[0])}: {off[1]}")
    return fitted


def fitted_sides(
    prices: TierPrices,
    candidates: Mapping[str, Price],
    tokens: np.ndarray,
    sides: tuple[str, str],
    windows: Mapping[str, int | None],
    quality: np.ndarray,
    cost: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(quality, cost), each (n, 2): column r is what choosing `sides[r]` (the small, the large
    tier) gives after the context-window rule, for records needing `tokens`; a refused record
    costs nothing and scores quality 0 (it got no answer)."""
    n = tokens.shape[0]
    rows = np.arange(n)
    q_out, c_out = np.empty_like(quality), np.empty_like(cost)
    for role, tier in ((SMALL, sides[0]), (LARGE, sides[1])):
        chosen = np.full(n, prices.index(tier), dtype=np.int64)
        fitted = fit_records(prices.names, chosen, tokens, windows, candidates)
        landed = prices.role[fitted.tier_idx]
        q_out[:, role] = np.where(fitted.refused, 0.0, quality[rows, landed])
        c_out[:, role] = np.where(fitted.refused, 0.0, cost[rows, landed])
    return q_out, c_out


def two_tier_policy(sim: SimConfig, name: str | None) -> Tunable:
    """The named policy, which must route by one `threshold` between two tiers."""
    policy = pick_policy(sim, name)
    if not isinstance(policy, Tunable):
        raise ReplayError(
            f"policy {policy.name!r} has no single threshold to sweep "
            "(use a 'threshold' or 'budget_pacing' policy)"
        )
    return policy


def sweep_inputs(
    prices: Mapping[str, Price],
    trace: ReplayTrace,
    scores: np.ndarray,
    policy: Tunable,
    windows: Mapping[str, int | None] | None = None,
) -> SweepInputs:
    """Per-request quality and cost of the policy's small and large tier, for the sweep.

    With context `windows`, a side is what the proxy serves when the policy picks that tier
    (simulations/context_fit.py): a record the small tier cannot hold costs and scores as the
    large one at every threshold; one no tier holds is refused: no cost, quality 0."""
    tier_prices = TierPrices.from_prices(prices)
    small, large = policy.small, policy.large
    for tier, want in ((small, SMALL), (large, LARGE)):
        if tier_prices.role[tier_prices.index(tier)] != want:
            raise ReplayError(
                f"policy {policy.name!r}: tier {tier!r} is not the config's "
                f"{'cheapest' if want == SMALL else 'priciest'} tier, which the trace's "
                f"{'small' if want == SMALL else 'large'} outcomes describe"
            )
    quality = trace.require_quality()
    cost = role_costs(tier_prices, trace.prompt_tokens, trace.completion_tokens, trace.cache)
    if windows and has_windows(windows, policy.tiers()):
        candidates = {t: prices[t] for t in policy.tiers()}
        tokens = record_tokens(trace.prompt_tokens, trace.completion_tokens)
        sides = (policy.small, policy.large)
        quality, cost = fitted_sides(tier_prices, candidates, tokens, sides, windows, quality, cost)
    return SweepInputs(
        scores=np.asarray(scores, dtype=np.float64),
        quality_small=quality[:, SMALL],
        quality_large=quality[:, LARGE],
        cost_small=cost[:, SMALL],
        cost_large=cost[:, LARGE],
    )
