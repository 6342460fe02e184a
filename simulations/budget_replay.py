"""Budgets over time: replay arrivals in order, charging each team's budget per period.

For every request: the team's policy decides (seeing the team's BudgetView, as in the proxy);
if the chosen tier's cost does not fit the remaining budget, the request is downgraded to the
cheapest tier when that fits (budgets.downgrade) and refused otherwise. The simulator charges the
actual cost; the proxy reserves the worst case first, so it may refuse slightly earlier.

The policy decides each request as `simulate`'s headline replay decides it (simulations/replay.py),
so the two never disagree before a budget acts: the policy's own model's scores, a calibrating
policy's threshold in force at that request (the same sequential replay, over the requests that
policy serves), then the context-window rule. Pacing wraps the policy at that threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from zoneinfo import ZoneInfo

import numpy as np

from policies.base import BatchContext, BudgetView, Policy, RoutingContext, Tunable
from policies.budget_pacing import BudgetPacingPolicy
from policies.budgets.periods import period_window
from policies.calibration import CalibratingPolicy, replay_decisions
from policies.config import BudgetsConfig
from policies.registry import build_policies
from simulations.context_fit import fit_records, has_windows, record_tokens
from simulations.replay import ReplayError, TierPrices, policy_scores
from simulations.sim_config import SimConfig
from simulations.trace import LARGE, SMALL, ReplayTrace


@dataclass
class TeamTally:
    team: str
    limit_usd: float | None
    period: str | None
    requests: int = 0
    served_large: int = 0
    downgraded: int = 0
    refused: int = 0
    spent_usd: float = 0.0  # over the whole trace (all periods)
    first_downgrade: float | None = None
    exhausted_at: float | None = None  # first refusal: the budget could not pay even small
    quality_sum: float = 0.0
    context_refused: int = 0  # no tier's context window holds the request (never charged)

    def as_dict(self) -> dict[str, object]:
        served = self.requests - self.refused
        return {
            "team": self.team,
            "limit_usd": self.limit_usd,
            "period": self.period,
            "requests": self.requests,
            "served": served,
            "large": self.served_large,
            "downgraded": self.downgraded,
            "refused": self.refused,
            "spent_usd": self.spent_usd,
            "first_downgrade": self.first_downgrade,
            "exhausted_at": self.exhausted_at,
            "quality_served": self.quality_sum / served if served else None,
            "context_refused": self.context_refused,
        }


def _policy_name(
    sim: SimConfig, policies: dict[str, Policy], team: str, override: str | None
) -> str:
    name = override or (sim.teams[team].policy if team in sim.teams else None)
    name = name or sim.default_policy
    if name not in policies:
        raise ReplayError(f"unknown policy {name!r} for team {team!r}")
    return name


def paced(policy: Policy, max_threshold: float = 1.0, slack: float = 0.2) -> BudgetPacingPolicy:
    """budget_pacing with the policy's own tiers and base threshold (what pacing would change).

    Any `Tunable` policy can be paced; a load-shedding wrapper has no load reading to act on in
    this replay, so pacing its threshold is all that changes."""
    if isinstance(policy, BudgetPacingPolicy):
        return policy  # paced already, with its own settings
    if not isinstance(policy, Tunable):
        raise ReplayError(f"policy {policy.name!r} has no threshold to pace")
    top = max(max_threshold, policy.threshold)
    return BudgetPacingPolicy(
        f"{policy.name}+pacing", policy.small, policy.large, policy.threshold, top, slack
    )


class _Ledger:
    """Spend per (team, period) while the trace is replayed in arrival order."""

    def __init__(self, budgets: BudgetsConfig, trace: ReplayTrace, prices: TierPrices) -> None:
        self.zone = ZoneInfo(budgets.timezone)
        self.downgrade = budgets.downgrade
        self.prices = prices
        self.cheapest = prices.role_tier(SMALL)
        self.cost = [
            prices.cost(
                np.full(len(trace), k), trace.prompt_tokens, trace.completion_tokens, trace.cache
            )
            for k in range(len(prices.names))
        ]
        self.spent: dict[tuple[str, str], float] = {}

    def view(self, tally: TeamTally, now: float) -> tuple[BudgetView, str]:
        window = period_window(tally.period or "total", now, self.zone)
        used = self.spent.get((tally.team, window.id), 0.0)
        return BudgetView(tally.limit_usd, used, 0.0, window.elapsed_fraction(now)), window.id

    def charge(
        self, tally: TeamTally, view: BudgetView, period: str, k: int, i: int, now: float
    ) -> int | None:
        """Serve request i on tier k, downgrade it, or refuse it (None); returns the tier."""
        cost = self.cost[k][i]
        limit = tally.limit_usd
        if limit is not None and view.spent_usd + cost > limit + 1e-12:
            small = self.cost[self.cheapest][i]
            if not (self.downgrade and k != self.cheapest and view.spent_usd + small <= limit):
                tally.refused += 1
                tally.exhausted_at = tally.exhausted_at or now
                return None
            k, cost = self.cheapest, small
            tally.downgraded += 1
            tally.first_downgrade = tally.first_downgrade or now
        self.spent[(tally.team, period)] = view.spent_usd + cost
        tally.spent_usd += cost
        return k


class _Decider:
    """One policy's decision on request i, as replay() makes it: on the policy's own scores, at a
    calibrating policy's threshold in force then, and after the context-window rule."""

    def __init__(
        self,
        sim: SimConfig,
        trace: ReplayTrace,
        scores: np.ndarray,
        name: str,
        policy: Policy,
        rows: np.ndarray,
        prices: TierPrices,
        pacing: tuple[float, float] | None,
    ) -> None:
        self.policy, self.pacing, self.prices = policy, pacing, prices
        self.scores = policy_scores(sim, trace, scores, name)
        self.thresholds: dict[int, float] = {}
        if isinstance(policy, CalibratingPolicy):
            # The headline replay's sequence of thresholds: calibration is sequential and
            # shared by every request the policy serves, whatever the budget does to them.
            units = trace.units()
            ctx = BatchContext(units=[units[i] for i in rows])
            done = replay_decisions(policy, self.scores[rows], ctx)
            self.thresholds = dict(zip(rows.tolist(), done.thresholds.tolist(), strict=True))
        self._at: dict[float, Policy] = {}
        # Where each tier's choice lands after the context-window rule (-1: none holds it).
        self.fitted: dict[int, np.ndarray] | None = None
        if has_windows(sim.context_windows, policy.tiers()):
            tokens = record_tokens(trace.prompt_tokens, trace.completion_tokens)
            candidates = {t: sim.prices[t] for t in policy.tiers()}
            self.fitted = {}
            for t in policy.tiers():
                k = prices.index(t)
                fit = fit_records(
                    prices.names, np.full(len(trace), k), tokens, sim.context_windows, candidates
                )
                self.fitted[k] = np.where(fit.refused, -1, fit.tier_idx)

    def _policy(self, i: int) -> Policy:
        t = self.thresholds.get(i)
        key = -1.0 if t is None else t
        if key not in self._at:
            base = self.policy
            if t is not None:
                assert isinstance(base, CalibratingPolicy)
                base = base.inner.with_threshold(t)
            self._at[key] = paced(base, *self.pacing) if self.pacing else base
        return self._at[key]

    def tier(self, i: int, ctx: RoutingContext) -> int:
        """Config-order tier index, or -1 when no context window holds the request."""
        k = self.prices.index(self._policy(i).decide(ctx).tier)
        return k if self.fitted is None else int(self.fitted[k][i])


def budget_replay(
    sim: SimConfig,
    trace: ReplayTrace,
    scores: np.ndarray,
    policy: str | None = None,
    pacing: tuple[float, float] | None = None,
) -> dict[str, TeamTally]:
    """Per-team tallies. pacing=(max_threshold, slack) wraps every team's policy in
    budget_pacing at its threshold in force."""
    times = trace.require_times()
    teams = trace.require_teams()
    units = trace.units()
    prices = TierPrices.from_prices(sim.prices)
    policies = build_policies(sim.policies, sim.env)
    ledger = _Ledger(sim.budgets, trace, prices)
    quality_idx = np.where(prices.role >= 0, prices.role, 0)
    # Which policy serves each request: the override, else the team's, else the default.
    names = [_policy_name(sim, policies, str(t), policy) for t in teams]
    deciders = {
        name: _Decider(
            sim,
            trace,
            scores,
            name,
            policies[name],
            np.flatnonzero(np.asarray(names) == name),
            prices,
            pacing,
        )
        for name in dict.fromkeys(names)
    }
    tallies: dict[str, TeamTally] = {}
    for i in range(len(trace)):
        team, now = str(teams[i]), float(times[i])
        if team not in tallies:
            limit = sim.teams[team].budget if team in sim.teams else None
            tallies[team] = TeamTally(
                team, limit.limit_usd if limit else None, limit.period if limit else None
            )
        tally = tallies[team]
        tally.requests += 1
        view, period = ledger.view(tally, now)
        decider = deciders[names[i]]
        ctx = RoutingContext(
            score=float(decider.scores[i]), team=team, budget=view, now=now, unit=units[i]
        )
        chosen = decider.tier(i, ctx)
        if chosen < 0:
            tally.context_refused += 1
            continue
        k = ledger.charge(tally, view, period, chosen, i, now)
        if k is None:
            continue
        tally.served_large += int(prices.role[k] == LARGE)
        q = trace.quality[i, quality_idx[k]]
        tally.quality_sum += 0.0 if np.isnan(q) else float(q)
    return tallies
