"""What the simulator replays with: tier prices, policies, teams and budgets.

The command layer (router/commands/simulate.py) builds a `SimConfig` from a router config's
sections (`SimConfig.from_sections`); without a config file the simulator uses its defaults
(`SIMULATOR_DEFAULTS`), which are the proxy's embedded defaults (`cost-router serve` without a
config, router/server/demo.py): the same tier prices (backends/example_prices.py, the RouteLLM data
README's: large $10/$30, small $0.60/$0.60 per million tokens), no `policies:` section, so the
built-in default policy routes between the cheapest and the priciest tier at the classifier
card's `default_threshold` (policies/registry.py `default_policy`), and the classifier's and
budgets' defaults. The defaults are a document shaped like those sections of a router config, so
the command layer applies the same `COST_ROUTER__*` environment overrides to a copy of it before
`from_document` validates it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from backends.config import Price, TierConfig
from backends.example_prices import EXAMPLE_PRICES
from classifiers.config import ClassifierConfig
from policies.config import BudgetsConfig, PolicyConfig, TeamConfig
from policies.registry import SPECS, PolicyEnv, check_routing, tiers_by_price
from trace_format.config_base import ConfigError

DEFAULT_POLICY = "balanced"

# The simulator's defaults, the sections of a router config it reads, as the embedded demo sets
# them: tiers (name and price only: nothing is called), policies (none: the built-in default
# policy at the card's threshold), default_policy, classifier, teams, budgets. Read-only: use
# `defaults_document()` for a copy to change. tests/simulations/test_sim_defaults.py checks them
# against router/server/demo.py's config.
SIMULATOR_DEFAULTS: Mapping[str, Any] = {
    "tiers": [{"name": name, "price": p.model_dump()} for name, p in EXAMPLE_PRICES.items()],
    "default_policy": DEFAULT_POLICY,
    "policies": {},
    "classifier": {},
    "teams": {},
    "budgets": {},
}

_Model = TypeVar("_Model", bound=BaseModel)


@dataclass(frozen=True)
class SimConfig:
    """The sections of a router config that a replay reads, and nothing else."""

    env: PolicyEnv  # tier prices (config order), the default policy's name, the classifier model
    policies: Mapping[str, PolicyConfig]
    teams: Mapping[str, TeamConfig] = field(default_factory=dict)  # budgets and policy per team
    budgets: BudgetsConfig = field(default_factory=BudgetsConfig)  # timezone, downgrade
    context_turns: int = 2  # the classifier's: how much of a conversation is scored
    draft_length: int | None = None  # speculative k of the priciest tier's launch profile
    # Each tier's `context_window` (absent or None: no limit), for simulations/context_fit.py.
    context_windows: Mapping[str, int | None] = field(default_factory=dict)

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
            context_windows={t.name: t.context_window for t in tiers},
        )

    @classmethod
    def from_document(cls, doc: Mapping[str, Any], source: str) -> SimConfig:
        """A SimConfig from a document shaped like `SIMULATOR_DEFAULTS` (its tiers need only a
        name and a price); each section is validated by its own model and errors name the key."""
        tiers = doc.get("tiers") or []
        if not isinstance(tiers, list) or not tiers:
            raise ConfigError(f"{source}: tiers: expected a non-empty list of name and price")
        prices: dict[str, Price] = {}
        windows: dict[str, int | None] = {}
        for i, tier in enumerate(tiers):
            name = tier.get("name") if isinstance(tier, dict) else None
            if not isinstance(name, str) or not name or name in prices:
                raise ConfigError(
                    f"{source}: tiers.{i}.name: expected a new tier name, got {name!r}"
                )
            prices[name] = _section(Price, tier.get("price"), f"tiers.{i}.price", source)
            windows[name] = _context_window(tier.get("context_window"), f"tiers.{i}", source)
        policies = {
            name: _section(PolicyConfig, p, f"policies.{name}", source)
            for name, p in _mapping(doc, "policies", source).items()
        }
        teams = {
            name: _section(TeamConfig, t, f"teams.{name}", source)
            for name, t in _mapping(doc, "teams", source).items()
        }
        classifier = _section(ClassifierConfig, doc.get("classifier"), "classifier", source)
        budgets = _section(BudgetsConfig, doc.get("budgets"), "budgets", source)
        default_policy = doc.get("default_policy", DEFAULT_POLICY)
        if not isinstance(default_policy, str):
            raise ConfigError(f"{source}: default_policy: expected a policy name")
        try:
            check_routing(policies, default_policy, prices, teams)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        return cls(
            env=PolicyEnv(prices, default_policy, classifier.model_path),
            policies=policies,
            teams=teams,
            budgets=budgets,
            context_turns=classifier.context_turns,
            context_windows=windows,
        )


def _context_window(value: Any, key: str, source: str) -> int | None:
    """A tier's `context_window` as TierConfig takes it: absent/None, or an integer >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{source}: {key}.context_window: expected an integer >= 1 (tokens)")
    return value


def _mapping(doc: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    value = doc.get(key) or {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: {key}: expected a mapping")
    return value


def _section(model: type[_Model], value: Any, key: str, source: str) -> _Model:
    try:
        return model.model_validate({} if value is None else value)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"])
            lines.append(f"{key}.{loc}: {e['msg']}" if loc else f"{key}: {e['msg']}")
        raise ConfigError(f"{source}: " + "; ".join(lines)) from None


def set_threshold(
    data: dict[str, Any],
    policy: str | None,
    threshold: float,
    target: tuple[str, float] | None = None,
    source: str = "the config",
) -> str:
    """Set `policies.<policy>.threshold` (default: the document's default policy) in a router
    config document, and `tuned_for` (the target it meets, which `classifier promote` re-tunes
    to); a fixed threshold replaces a target share. Returns the policy name set; raises
    ConfigError (naming `source`) for a policy type without a threshold."""
    name = policy or data.get("default_policy") or DEFAULT_POLICY
    policies = data.setdefault("policies", {}) or {}
    data["policies"] = policies
    entry = policies.setdefault(name, {"type": "threshold"})
    spec = SPECS.get(str(entry.get("type")))
    if spec is None or "threshold" not in spec.params.model_fields:
        raise ConfigError(f"{source}: policies.{name} has type {entry.get('type')!r}: no threshold")
    entry.pop("target_large_share", None)
    entry["threshold"] = round(float(threshold), 6)
    if target is not None:
        entry["tuned_for"] = {"kind": target[0], "value": float(target[1])}
    return name


def defaults_document() -> dict[str, Any]:
    """A deep copy of `SIMULATOR_DEFAULTS`, for the caller to change (environment overrides)."""
    return copy.deepcopy(dict(SIMULATOR_DEFAULTS))


def default_sim_config() -> SimConfig:
    """The simulator's defaults (a new object each call: callers may not share mutable state)."""
    return SimConfig.from_document(defaults_document(), "the simulator's defaults")


def describe_prices(prices: Mapping[str, Price]) -> str:
    return ", ".join(
        f"{name} ${p.input_per_mtok:g}/${p.output_per_mtok:g}" for name, p in prices.items()
    )
