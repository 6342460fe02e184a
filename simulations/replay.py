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
from simulations.sim_config import SimConfig
from simulations.sweep import SweepInputs
from simulations.trace import LARGE, SMALL, ReplayTrace, TraceError


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
        )

    def index(self, tier: str) -> int:
        try:
            return self.names.index(tier)
        except ValueError:
            raise ReplayError(
                f"tier {tier!r} has no price: it is not in the config's tiers"
            ) from None

    def cost(
        self, tier_idx: np.ndarray, prompt_tokens: np.ndarray, completion_tokens: np.ndarray
    ) -> np.ndarray:
        """USD per request when request i is served by tier tier_idx[i].

        completion_tokens is (n, 2), per outcome role; a tier uses its own role's count."""
        role = np.maximum(self.role[tier_idx], 0)
        completion = completion_tokens[np.arange(tier_idx.shape[0]), role]
        # The proxy's formula (whole nano-USD), so replayed costs equal the traced ones exactly.
        nanos = cost_nanos(
            self.input_per_mtok[tier_idx], self.output_per_mtok[tier_idx], prompt_tokens, completion
        )
        return np.asarray(nanos, dtype=np.float64) / NANOS_PER_USD

    def role_tier(self, role: int) -> int:
        """Config index of the tier that has this outcome role."""
        return int(np.flatnonzero(self.role == role)[0])


def role_costs(
    prices: TierPrices, prompt_tokens: np.ndarray, completion_tokens: np.ndarray
) -> np.ndarray:
    """(n, 2) cost per request if served by the small-role / the large-role tier."""
    n = prompt_tokens.shape[0]
    return np.stack(
        [
            prices.cost(np.full(n, prices.role_tier(r)), prompt_tokens, completion_tokens)
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

    def summary(self) -> dict[str, object]:
        n = self.tier_idx.shape[0]
        counts = np.bincount(self.tier_idx, minlength=len(self.tiers))
        known = ~np.isnan(self.quality)
        return {
            "policy": self.policy,
            "requests": int(n),
            "share": {t: float(c / n) for t, c in zip(self.tiers, counts, strict=True)},
            "cost_usd": float(self.cost_usd.sum()),
            "cost_per_1k": float(self.cost_usd.mean() * 1000),
            "quality": float(self.quality[known].mean()) if known.any() else None,
            "quality_known": int(known.sum()),
        }


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
    return ReplayResult(
        policy=policy.name,
        tiers=prices.names,
        tier_idx=tier_idx,
        cost_usd=prices.cost(tier_idx, trace.prompt_tokens, trace.completion_tokens),
        quality=trace.quality[rows, role],
        scores=scores,
    )


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
    prices: Mapping[str, Price], trace: ReplayTrace, scores: np.ndarray, policy: Tunable
) -> SweepInputs:
    """Per-request quality and cost of the policy's small and large tier, for the sweep."""
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
    cost = role_costs(tier_prices, trace.prompt_tokens, trace.completion_tokens)
    return SweepInputs(
        scores=np.asarray(scores, dtype=np.float64),
        quality_small=quality[:, SMALL],
        quality_large=quality[:, LARGE],
        cost_small=cost[:, SMALL],
        cost_large=cost[:, LARGE],
    )
