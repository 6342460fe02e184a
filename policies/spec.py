"""What a policy type registers: its params model and its builder, and what a builder gets.

Each policy module defines `SPEC = PolicySpec(<params model>, <builder>)` next to its class;
policies/registry.py lists the SPECs by type name. Params models forbid extra keys (typos are
caught) and a builder raises ConfigError naming `policies.<name>.<key>`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from backends.config import Price
from classifiers.model_files import ModelFiles
from policies.base import Policy
from policies.sessions.config import SessionParams
from policies.target_share import ReferenceTraceError, convert_share, load_reference_scores
from policies.workflow import WorkflowParams
from trace_format.config_base import ConfigError

DEFAULT_THRESHOLD = 0.5
CARD_KEY = "default_threshold"


def card_threshold(model_path: str | None) -> float:
    """Threshold when a policy gives none: the classifier card's `default_threshold` (the model's
    JSON metadata, written at training), else 0.5. Read as JSON: no scoring needed here."""
    try:
        card = ModelFiles.of(model_path).card
        value = json.loads(card.read_text(encoding="utf-8")).get(CARD_KEY)
    except (OSError, ValueError, AttributeError):
        return DEFAULT_THRESHOLD
    return float(value) if isinstance(value, int | float) and 0 <= value <= 1 else DEFAULT_THRESHOLD


def price_rank(price: Price) -> float:
    """One number to order tiers by: USD per million input + output tokens."""
    return price.input_per_mtok + price.output_per_mtok


def tiers_by_price(prices: Mapping[str, Price]) -> list[str]:
    """Tier names cheapest first (stable for equal prices: config order)."""
    return sorted(prices, key=lambda name: price_rank(prices[name]))


@dataclass(frozen=True)
class PolicyEnv:
    """What building policies needs besides their params: the tiers' prices (in config order),
    the default policy's name and the classifier model (for its card threshold and rescoring)."""

    prices: Mapping[str, Price]
    default_policy: str = "balanced"
    model_path: str | None = None


class PolicyParams(BaseModel):
    """A policy's config entry: `type` plus the type's own keys (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")
    type: str
    # Every type takes it: how decisions hold across a conversation (policies/sessions/).
    session: SessionParams | None = Field(
        default=None,
        description="session mode (docs/conversations.md); none = per_request with tool loops "
        "kept on their tier",
    )
    # Every type takes it too: a workflow's requests go to its tier, unscored (policies/workflow.py)
    workflows: list[WorkflowParams] = Field(
        default_factory=list,
        description="workflows (teams, `metadata` tags) sent to a tier of their own, e.g. a "
        "distilled student (docs/levers.md); first match wins; a tier the client names is "
        "never overridden",
    )


class ShareSource(PolicyParams):
    """Params of a type whose thresholds may be given as target shares of a reference trace."""

    reference_trace: str | None = Field(default=None, description="JSONL trace with scores")
    rescore: bool = Field(default=False, description="score the trace's prompts with our model")


class TunedFor(BaseModel):
    """The target a threshold was picked for (`cost-router tune --write` records it), so
    `cost-router classifier promote` can pick the new model's threshold for the same target."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["quality", "cost", "large_share"] = Field(
        description="quality: >= value of all-large quality; cost: <= value USD per 1,000 "
        "requests; large_share: <= value of requests to the large tier"
    )
    value: float = Field(ge=0)


class TwoTierParams(ShareSource):
    """A small and a large tier split by one threshold (or a target share of large traffic)."""

    small: str | None = Field(default=None, description="default: the cheapest tier")
    large: str | None = Field(default=None, description="default: the priciest tier")
    threshold: float | None = Field(default=None, ge=0, le=1)
    target_large_share: float | None = Field(default=None, ge=0, le=1)
    tuned_for: TunedFor | None = Field(
        default=None,
        description="the target `tune --write` picked threshold for; `classifier promote` "
        "re-tunes to it (routing ignores it)",
    )

    @model_validator(mode="after")
    def _one_threshold(self) -> TwoTierParams:
        if self.threshold is not None and self.target_large_share is not None:
            raise ValueError("give threshold or target_large_share, not both")
        if (
            self.target_large_share is not None
            and not self.reference_trace
            and not self.calibrates()
        ):
            raise ValueError("target_large_share needs reference_trace (or calibrate)")
        return self

    def calibrates(self) -> bool:
        """Whether the target share is held on live traffic (a threshold policy's `calibrate:`,
        policies/calibration.py): then a reference trace gives only the starting threshold."""
        return False


class Builder:
    """What a builder gets: the policy name, the environment, a scores cache shared by the
    policies of one build (so a reference trace is read once)."""

    def __init__(
        self, name: str, env: PolicyEnv, cache: dict[tuple[str, bool, str | None], Any]
    ) -> None:
        self.name = name
        self.env = env
        self.by_price = tiers_by_price(env.prices)
        self._cache = cache

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"policies.{self.name}.{key}: {message}")

    def scores(self, params: ShareSource) -> tuple[np.ndarray, str]:
        """The reference trace's scores and its path (for the conversion log)."""
        assert params.reference_trace
        # Rescored scores depend on the model (a policy may name its own).
        model = self.env.model_path if params.rescore else None
        key = (params.reference_trace, params.rescore, model)
        if key not in self._cache:
            try:
                self._cache[key] = load_reference_scores(
                    params.reference_trace, self.env.model_path, params.rescore
                )
            except ReferenceTraceError as exc:
                raise self.error("reference_trace", str(exc)) from None
        return self._cache[key], params.reference_trace

    def threshold(self, params: TwoTierParams) -> float:
        """The given threshold, the target share's, or the classifier card's."""
        if params.target_large_share is None:
            if params.threshold is None:
                return card_threshold(self.env.model_path)
            return params.threshold
        scores, source = self.scores(params)
        return convert_share(self.name, params.target_large_share, scores, source)

    def two_tiers(self, small: str | None, large: str | None) -> tuple[str, str]:
        """(small, large), defaulting to the cheapest and the priciest tier; small costs less."""
        small, large = small or self.by_price[0], large or self.by_price[-1]
        for key, tier in (("small", small), ("large", large)):
            if tier not in self.by_price:
                raise self.error(key, f"unknown tier {tier!r}")
        if price_rank(self.env.prices[small]) > price_rank(self.env.prices[large]):
            raise self.error("small", f"{small!r} costs more than {large!r}")
        return small, large


@dataclass(frozen=True)
class PolicySpec:
    """One policy type: the params model its config entry validates against, and the builder
    that turns validated params into a policy (raising ConfigError for what needs the tiers)."""

    params: type[PolicyParams]
    build: Callable[[Builder, Any], Policy]
