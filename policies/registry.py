"""Config -> policy objects. Validates each policy's params and names the offending key.

Each policy type has a params model (extra keys forbidden, so typos are caught) and a builder.
To add an option or a type: extend its params model and builder, or add a `_Spec` to `SPECS`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from policies.base import Policy
from policies.budget_pacing import BudgetPacingPolicy
from policies.fixed import FixedPolicy
from policies.load_aware import LoadShedParams, LoadShedPolicy
from policies.random_split import RandomPolicy
from policies.target_share import ReferenceTraceError, convert_share, load_reference_scores
from policies.threshold import ThresholdPolicy
from policies.tiers import TiersPolicy
from router.config import ConfigError, PolicyConfig, RouterConfig, TierConfig

DEFAULT_THRESHOLD = 0.5
CARD_KEY = "default_threshold"


def card_threshold(config: RouterConfig) -> float:
    """Threshold when a policy gives none: the classifier card's `default_threshold` (the model's
    JSON metadata, written at training), else 0.5. Read as JSON: no onnxruntime needed here."""
    import classifiers

    model = config.classifier.model_path
    onnx = Path(model) if model else Path(classifiers.__file__).parent / "default" / "model.onnx"
    try:
        value = json.loads(onnx.with_suffix(".json").read_text(encoding="utf-8")).get(CARD_KEY)
    except (OSError, ValueError, AttributeError):
        return DEFAULT_THRESHOLD
    return float(value) if isinstance(value, int | float) and 0 <= value <= 1 else DEFAULT_THRESHOLD


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str


class _ShareSource(_Params):
    reference_trace: str | None = Field(default=None, description="JSONL trace with scores")
    rescore: bool = Field(default=False, description="score the trace's prompts with our model")


class TwoTierParams(_ShareSource):
    small: str | None = Field(default=None, description="default: the cheapest tier")
    large: str | None = Field(default=None, description="default: the priciest tier")
    threshold: float | None = Field(default=None, ge=0, le=1)
    target_large_share: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _one_threshold(self) -> TwoTierParams:
        if self.threshold is not None and self.target_large_share is not None:
            raise ValueError("give threshold or target_large_share, not both")
        if self.target_large_share is not None and not self.reference_trace:
            raise ValueError("target_large_share needs reference_trace")
        return self


class ThresholdParams(TwoTierParams):
    load_shed: LoadShedParams | None = Field(
        default=None, description="send borderline requests small while the large tier queues"
    )


class BudgetPacingParams(TwoTierParams):
    max_threshold: float = Field(default=1.0, ge=0, le=1)
    slack: float = Field(default=0.2, gt=0, le=1)
    reserve: float = Field(default=0.02, ge=0, lt=1, description="share of the limit kept back")


class TiersParams(_ShareSource):
    tiers: list[str] | None = Field(default=None, description="cheapest first; default: all")
    thresholds: list[float] | None = None
    target_shares: list[float] | None = Field(
        default=None, description="share of traffic at or above each band, descending"
    )

    @model_validator(mode="after")
    def _bands(self) -> TiersParams:
        if (self.thresholds is None) == (self.target_shares is None):
            raise ValueError("give exactly one of thresholds or target_shares")
        values = self.thresholds if self.thresholds is not None else self.target_shares or []
        if any(not 0 <= v <= 1 for v in values):
            raise ValueError("thresholds and target_shares must be in [0, 1]")
        if self.thresholds is not None and values != sorted(values):
            raise ValueError("thresholds must be ascending")
        if self.target_shares is not None:
            if values != sorted(values, reverse=True):
                raise ValueError("target_shares must be descending")
            if not self.reference_trace:
                raise ValueError("target_shares needs reference_trace")
        return self


class FixedParams(_Params):
    tier: str | None = Field(default=None, description="default: the cheapest tier")


class RandomParams(_Params):
    small: str | None = None
    large: str | None = None
    p: float = Field(ge=0, le=1, description="probability of the large tier")
    seed: str = ""


def tier_price(tier: TierConfig) -> float:
    """One number to order tiers by: USD per million input + output tokens."""
    return tier.price.input_per_mtok + tier.price.output_per_mtok


def tiers_by_price(config: RouterConfig) -> list[str]:
    """Tier names cheapest first (stable for equal prices: config order)."""
    return [t.name for t in sorted(config.tiers, key=tier_price)]


class _Build:
    """What a builder gets: the policy name, the running config, a scores cache for shares."""

    def __init__(self, name: str, config: RouterConfig, cache: dict[tuple[str, bool], Any]):
        self.name = name
        self.config = config
        self.by_price = tiers_by_price(config)
        self._cache = cache

    def scores(self, params: _ShareSource) -> tuple[np.ndarray, str]:
        assert params.reference_trace
        key = (params.reference_trace, params.rescore)
        if key not in self._cache:
            try:
                self._cache[key] = load_reference_scores(
                    params.reference_trace, self.config.classifier.model_path, params.rescore
                )
            except ReferenceTraceError as exc:
                raise ConfigError(f"policies.{self.name}.reference_trace: {exc}") from None
        return self._cache[key], params.reference_trace

    def threshold(self, params: TwoTierParams) -> float:
        if params.target_large_share is None:
            return card_threshold(self.config) if params.threshold is None else params.threshold
        scores, source = self.scores(params)
        return convert_share(self.name, params.target_large_share, scores, source)

    def two_tiers(self, params: TwoTierParams | RandomParams) -> tuple[str, str]:
        small, large = params.small or self.by_price[0], params.large or self.by_price[-1]
        for key, tier in (("small", small), ("large", large)):
            if tier not in self.by_price:
                raise ConfigError(f"policies.{self.name}.{key}: unknown tier {tier!r}")
        if tier_price(self.config.tier(small)) > tier_price(self.config.tier(large)):
            raise ConfigError(f"policies.{self.name}.small: {small!r} costs more than {large!r}")
        return small, large


def _threshold(b: _Build, p: ThresholdParams) -> Policy:
    small, large = b.two_tiers(p)
    policy = ThresholdPolicy(b.name, small, large, b.threshold(p))
    if p.load_shed is None:
        return policy
    return LoadShedPolicy(policy, p.load_shed.max_waiting, p.load_shed.margin)


def _budget_pacing(b: _Build, p: BudgetPacingParams) -> Policy:
    small, large = b.two_tiers(p)
    t = b.threshold(p)
    if p.max_threshold < t:
        raise ConfigError(f"policies.{b.name}.max_threshold: must be >= threshold ({t:.4f})")
    return BudgetPacingPolicy(b.name, small, large, t, p.max_threshold, p.slack, p.reserve)


def _tiers(b: _Build, p: TiersParams) -> Policy:
    names = p.tiers or b.by_price
    unknown = [n for n in names if n not in b.by_price]
    if unknown:
        raise ConfigError(f"policies.{b.name}.tiers: unknown tiers {unknown}")
    if len(names) < 2:
        raise ConfigError(f"policies.{b.name}.tiers: needs at least 2 tiers")
    prices = [tier_price(b.config.tier(n)) for n in names]
    if prices != sorted(prices):
        raise ConfigError(f"policies.{b.name}.tiers: must be ordered cheapest first by price")
    bands = p.thresholds if p.thresholds is not None else p.target_shares or []
    if len(bands) != len(names) - 1:
        key = "thresholds" if p.thresholds is not None else "target_shares"
        raise ConfigError(f"policies.{b.name}.{key}: {len(names)} tiers need {len(names) - 1}")
    if p.target_shares is not None:
        scores, source = b.scores(p)
        bands = [convert_share(f"{b.name}[{i}]", s, scores, source)
                 for i, s in enumerate(p.target_shares)]
    return TiersPolicy(b.name, names, bands)


def _fixed(b: _Build, p: FixedParams) -> Policy:
    return FixedPolicy(b.name, p.tier or b.by_price[0])


def _random(b: _Build, p: RandomParams) -> Policy:
    small, large = b.two_tiers(p)
    return RandomPolicy(b.name, small, large, p.p, p.seed)


@dataclass(frozen=True)
class _Spec:
    params: type[_Params]
    build: Callable[[_Build, Any], Policy]


SPECS: dict[str, _Spec] = {
    "threshold": _Spec(ThresholdParams, _threshold),
    "budget_pacing": _Spec(BudgetPacingParams, _budget_pacing),
    "tiers": _Spec(TiersParams, _tiers),
    "fixed": _Spec(FixedParams, _fixed),
    "random": _Spec(RandomParams, _random),
}


def parse_params(name: str, policy: PolicyConfig) -> _Params:
    """Validate one policy's params (no file access); ConfigError names `policies.<name>.<key>`."""
    spec = SPECS.get(policy.type)
    if spec is None:
        raise ConfigError(f"policies.{name}.type: unknown policy type {policy.type!r}")
    try:
        return spec.params.model_validate(policy.model_dump())
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"])
            key = f"policies.{name}.{loc}" if loc else f"policies.{name}"
            lines.append(f"{key}: {e['msg']}")
        raise ConfigError("; ".join(lines)) from None


def validate_policy_params(config: RouterConfig) -> None:
    for name, policy in config.policies.items():
        parse_params(name, policy)


def default_policy(config: RouterConfig) -> Policy:
    """The policy used when config.policies is empty: cheapest vs priciest tier, at the
    classifier card's threshold."""
    order = tiers_by_price(config)
    if len(order) == 1:
        return FixedPolicy(config.default_policy, order[0])
    return ThresholdPolicy(config.default_policy, order[0], order[-1], card_threshold(config))


def build_policies(config: RouterConfig) -> dict[str, Policy]:
    """Every configured policy by name; raises ConfigError naming the offending key."""
    if not config.policies:
        return {config.default_policy: default_policy(config)}
    cache: dict[tuple[str, bool], Any] = {}
    built: dict[str, Policy] = {}
    for name, policy in config.policies.items():
        params = parse_params(name, policy)
        built[name] = SPECS[policy.type].build(_Build(name, config, cache), params)
    return built
