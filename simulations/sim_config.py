"""What the simulator replays with: tier prices, policies, teams and budgets.

The command layer (router/commands/simulate.py) builds a `SimConfig` from a router config's
sections (`SimConfig.from_sections`); without a config file the simulator uses its defaults: the
prices of the shared RouteLLM data's README (large $10/$30, small $0.60/$0.60 per million
tokens) and one `threshold` policy, so `cost-router tune` works on the data out of the box.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from backends.config import Price, TierConfig
from classifiers.config import ClassifierConfig
from policies.config import BudgetsConfig, PolicyConfig, TeamConfig
from policies.registry import PolicyEnv, tiers_by_price

DEFAULT_POLICY = "balanced"


@dataclass(frozen=True)
class SimConfig:
    """The sections of a router config that a replay reads, and nothing else."""

    env: PolicyEnv  # tier prices (config order), the default policy's name, the classifier model
    policies: Mapping[str, PolicyConfig]
    teams: Mapping[str, TeamConfig] = field(default_factory=dict)  # budgets and policy per team
    budgets: BudgetsConfig = field(default_factory=BudgetsConfig)  # timezone, downgrade
    context_turns: int = 2  # the classifier's: how much of a conversation is scored
    draft_length: int | None = None  # speculative k of the priciest tier's launch profile

    @property
    def prices(self) -> Mapping[str, Price]:
        return self.env.prices

    @property
    def default_policy(self) -> str:
        return self.env.default_policy

    @property
    def model_path(self) -> str | None:
        return self.env.model_path

    @classmethod
    def from_sections(
        cls,
        tiers: Sequence[TierConfig],
        policies: Mapping[str, PolicyConfig],
        default_policy: str,
        classifier: ClassifierConfig,
        teams: Mapping[str, TeamConfig],
        budgets: BudgetsConfig,
    ) -> SimConfig:
        prices = {t.name: t.price for t in tiers}
        priciest = next(t for t in tiers if t.name == tiers_by_price(prices)[-1])
        spec = priciest.launch.speculative if priciest.launch else None
        return cls(
            env=PolicyEnv(prices, default_policy, classifier.model_path),
            policies=policies,
            teams=teams,
            budgets=budgets,
            context_turns=classifier.context_turns,
            draft_length=spec.num_speculative_tokens if spec else None,
        )


def default_sim_config() -> SimConfig:
    """The simulator's defaults (a new object each call: callers may not share mutable state)."""
    prices = {
        "small": Price(input_per_mtok=0.6, output_per_mtok=0.6),
        "large": Price(input_per_mtok=10.0, output_per_mtok=30.0),
    }
    policy = PolicyConfig(type="threshold", small="small", large="large", threshold=0.5)
    return SimConfig(env=PolicyEnv(prices, DEFAULT_POLICY), policies={DEFAULT_POLICY: policy})


def describe_prices(prices: Mapping[str, Price]) -> str:
    return ", ".join(
        f"{name} ${p.input_per_mtok:g}/${p.output_per_mtok:g}" for name, p in prices.items()
    )
