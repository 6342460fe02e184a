"""`what-if`: the same trace under each lever alone, then combined.

Levers: routing (the configured threshold policy), speculative decoding on the large tier
(decode speed-up from acceptance rate and draft length, output unchanged), and a quantized or
distilled small tier (faster by a speed factor, quality scaled by a quality factor). Baselines are
all-large and all-small. Each scenario reports cost, quality and p50/p95 end-to-end latency from
the queueing simulation over the trace's arrival times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from backends.config import NANOS_PER_USD
from policies.registry import tiers_by_price
from policies.sessions.config import MODES, Mode
from simulations.latency import (
    LatencyResult,
    TierLatency,
    simulate,
    spec_speedup,
    with_speculative,
    with_speed_factor,
)
from simulations.replay import ReplayError, TierPrices, replay, role_costs
from simulations.session_inputs import Graded
from simulations.sessions import (
    CacheModel,
    SessionReplay,
    SessionTrace,
    as_served,
    replay_sessions,
)
from simulations.sim_config import SimConfig
from simulations.trace import LARGE, SMALL, ReplayTrace

DEFAULT_DRAFT_LENGTH = 5  # draft tokens per step when neither the command nor a launch profile says


@dataclass(frozen=True, slots=True)
class Levers:
    small: TierLatency
    large: TierLatency
    spec_acceptance: float = 0.7
    spec_k: int = DEFAULT_DRAFT_LENGTH
    draft_cost: float = 0.0  # n-gram / prompt-lookup drafting costs ~nothing
    quant_speed: float = 1.6
    quant_quality: float = 0.98
    quant_cost: float = 1.0  # price multiplier of the quantized small tier
    # A measured decode speed-up (a lever trial's levers.json): used instead of the one the
    # acceptance rate and draft length imply. None = from spec_acceptance and spec_k.
    spec_speedup: float | None = None
    # A measured quality change in points (a lever trial's levers.json), added to each small-tier
    # outcome instead of the ratio quant_quality: a ratio of two small means (a weak local model
    # that gets 2 of 18 right, then 0) would zero the simulated tier. None = quant_quality.
    quant_quality_delta: float | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    lever: str  # baseline | alone | combined
    tier_role: np.ndarray  # SMALL/LARGE per request
    quant: bool
    spec: bool


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    lever: str
    cost_per_1k: float
    quality: float
    large_share: float
    latency: LatencyResult

    @property
    def max_utilization(self) -> float:
        return max(self.latency.utilization, default=0.0)

    def row(self) -> dict[str, object]:
        return {
            "scenario": self.name,
            "lever": self.lever,
            "cost_per_1k": self.cost_per_1k,
            "quality": self.quality,
            "large_share": self.large_share,
            "max_utilization": self.max_utilization,
            **self.latency.percentiles(),
        }


ROUTED = "routed"  # the configured policy's scenario, the one the others are compared with


def scenarios(routed_role: np.ndarray) -> list[Scenario]:
    n = routed_role.shape[0]
    large = np.full(n, LARGE)
    small = np.full(n, SMALL)
    return [
        Scenario("all-large", "baseline", large, False, False),
        Scenario("all-small", "baseline", small, False, False),
        Scenario("all-large + spec decoding", "alone", large, False, True),
        Scenario("all-small quantized", "alone", small, True, False),
        Scenario(ROUTED, "alone", routed_role, False, False),
        Scenario("routed + quantized small", "combined", routed_role, True, False),
        Scenario("routed + spec decoding on large", "combined", routed_role, False, True),
        Scenario("routed + quantized small + spec", "combined", routed_role, True, True),
    ]


def run_scenario(
    s: Scenario,
    trace: ReplayTrace,
    arrivals: np.ndarray,
    levers: Levers,
    role_cost: np.ndarray,
) -> ScenarioResult:
    rows = np.arange(len(trace))
    small = with_speed_factor(levers.small, levers.quant_speed) if s.quant else levers.small
    if s.spec and levers.spec_speedup is not None:
        large = replace(levers.large, per_token_s=levers.large.per_token_s / levers.spec_speedup)
    elif s.spec:
        large = with_speculative(
            levers.large, levers.spec_acceptance, levers.spec_k, levers.draft_cost
        )
    else:
        large = levers.large
    quality = trace.quality[rows, s.tier_role].copy()
    cost = role_cost[rows, s.tier_role].copy()
    if s.quant:
        on_small = s.tier_role == SMALL
        if levers.quant_quality_delta is not None:
            quality[on_small] = np.clip(quality[on_small] + levers.quant_quality_delta, 0.0, 1.0)
        else:
            quality[on_small] *= levers.quant_quality
        cost[on_small] *= levers.quant_cost
    completion = trace.completion_tokens[rows, s.tier_role]
    lat = simulate(arrivals, s.tier_role, trace.prompt_tokens, completion, [small, large])
    return ScenarioResult(
        name=s.name,
        lever=s.lever,
        cost_per_1k=float(cost.mean() * 1000),
        quality=float(np.nanmean(quality)),
        large_share=float((s.tier_role == LARGE).mean()),
        latency=lat,
    )


def what_if(
    sim: SimConfig,
    trace: ReplayTrace,
    scores: np.ndarray,
    arrivals: np.ndarray,
    levers: Levers,
    policy: str | None = None,
) -> list[ScenarioResult]:
    prices = TierPrices.from_prices(sim.prices)
    routed = replay(sim, trace, scores, policy)
    role_cost = role_costs(prices, trace.prompt_tokens, trace.completion_tokens, trace.cache)
    return [
        run_scenario(s, trace, arrivals, levers, role_cost)
        for s in scenarios(prices.role[routed.tier_idx])
    ]


def _quant_quality(levers: Levers) -> str:
    if levers.quant_quality_delta is not None:
        return f"quality {levers.quant_quality_delta * 100:+.1f} points"
    return f"quality x{levers.quant_quality:.3g}"


def spec_summary(levers: Levers) -> str:
    if levers.spec_speedup is not None:
        return (
            f"spec decoding: measured decode speed-up {levers.spec_speedup:.3g}x; quantized "
            f"small: {levers.quant_speed:.3g}x speed, {_quant_quality(levers)}"
        )
    return (
        f"spec decoding: acceptance {levers.spec_acceptance:g}, k {levers.spec_k}, draft cost "
        f"{levers.draft_cost:g} -> decode speed-up "
        f"{spec_speedup(levers.spec_acceptance, levers.spec_k, levers.draft_cost):.2f}x; "
        f"quantized small: {levers.quant_speed:g}x speed, quality x{levers.quant_quality:g}"
    )


def poisson_arrivals(n: int, rate_per_s: float, seed: int = 0) -> np.ndarray:
    """Arrival times for traces that recorded none."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate_per_s, n))


def _session_latency(
    run: SessionReplay, trace: SessionTrace, sim: SimConfig, levers: Levers
) -> LatencyResult:
    """The queueing model over the served requests of a session replay, in arrival order."""
    order = tiers_by_price(sim.prices)
    roles = {order[0]: SMALL, order[-1]: LARGE}
    served = [i for i, t in enumerate(run.tiers) if t is not None]
    for i in served:
        if run.tiers[i] not in roles:
            raise ReplayError(
                f"{trace.ids[i]}: what-if models two tiers (the cheapest and the priciest); this "
                f"replay sends a request to {run.tiers[i]!r}"
            )
    rows = np.asarray(served, dtype=np.int64)
    rows = rows[np.argsort(trace.times[rows], kind="stable")]
    role = np.asarray([roles[str(run.tiers[i])] for i in rows.tolist()], dtype=np.int64)
    return simulate(
        trace.times[rows],
        role,
        trace.prompt_tokens[rows],
        trace.completion_tokens[rows],
        [levers.small, levers.large],
    )


def session_what_if(
    sim: SimConfig,
    trace: SessionTrace,
    cache: CacheModel,
    levers: Levers,
    outcomes: Mapping[str, Mapping[str, float]],
    policy_name: str | None = None,
    modes: Sequence[Mode] = MODES,
) -> list[dict[str, object]]:
    """Each session mode on the same conversations (simulations/sessions.py), then all-large,
    all-small and the trace as it was served: requests, sessions, switches per session, large
    share, cached share of the prompt, cost with and without caching and as a share of
    all-large (with caching), quality on the requests graded on both tiers (None without), and
    p50/p95 end-to-end latency at the trace's arrival times with the tiers' latency levers as
    given (no quantization or speculative decoding)."""
    order = tiers_by_price(sim.prices)
    small, large = order[0], order[-1]
    graded = Graded.of(trace, outcomes, (small, large))
    runs = [(m, replay_sessions(sim, trace, m, cache, policy_name)) for m in modes]
    for label, tier in (("all-large", large), ("all-small", small)):
        runs.append(
            (
                label,
                replay_sessions(sim, trace, "per_request", cache, policy_name, [tier] * len(trace)),
            )
        )
    runs.append(("trace", as_served(trace, sim, cache)))
    all_large = next(int(r.cost_nanos.sum()) for label, r in runs if label == "all-large")
    rows = []
    for label, run in runs:
        nanos = int(run.cost_nanos.sum())
        row = run.summary(trace.prompt_tokens, large)
        row["mode"] = label
        row["cost_per_1k"] = nanos / NANOS_PER_USD / max(1, len(trace)) * 1000
        row["share_of_all_large"] = nanos / all_large if all_large else None
        row["quality"] = graded.quality(run)
        row["graded"] = len(graded)
        row.update(_session_latency(run, trace, sim, levers).percentiles())
        rows.append(row)
    return rows
