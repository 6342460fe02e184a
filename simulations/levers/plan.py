"""A trial plan (`cost-router levers plan FILE.yaml`): the reference, each candidate alone, then
the combinations, on the same prompts, reported in one table in that order (docs/levers.md).

    reference: large                 # a tier of the router config
    candidates:
      - {tier: small-q2k, lever: quantization}
      - {tier: large-spec, lever: speculative}
    combinations:
      - {name: routed + quantized small, small: small-q2k, large: large}
      - {name: routed + spec large, small: small, large: large-spec}
      - {name: all together, small: small-q2k, large: large-spec}
    threshold: 0.5                   # routing: a score >= threshold goes to the large tier
    # large_share: 0.5               # or: the threshold sending half of these prompts large
    traces: [data/gsm8k]             # optional; --traces overrides
    n: 200
    max_tokens: 128
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Lever = Literal["quantization", "distillation", "speculative"]
LEVERS: tuple[str, ...] = ("quantization", "distillation", "speculative")


class PlanError(ValueError):
    """An unusable plan file; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlanCandidate(_Strict):
    tier: str = Field(description="a tier of the router config")
    lever: Lever | None = Field(
        default=None,
        description="what the tier changes; None = speculative when its launch profile has "
        "`speculative`, else quantization",
    )


class PlanCombination(_Strict):
    name: str = Field(description="the row's name in the table")
    small: str = Field(description="tier for prompts scoring below the threshold")
    large: str = Field(description="tier for the others")
    threshold: float | None = Field(
        default=None, ge=0, le=1, description="None = the plan's `threshold`"
    )


class TrialPlan(_Strict):
    reference: str = Field(description="the tier every candidate is compared with")
    candidates: list[PlanCandidate] = Field(
        default_factory=list, description="each measured alone, in this order"
    )
    combinations: list[PlanCombination] = Field(
        default_factory=list,
        description="routing between two measured tiers on the shipped classifier's score; "
        "tiers that are not candidates are measured too",
    )
    threshold: float = Field(
        default=0.5, ge=0, le=1, description="routing threshold of the combinations"
    )
    large_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="instead of `threshold`: the threshold that sends this share of the trial's "
        "prompts to the large tier (policies/target_share.py)",
    )
    traces: list[str] = Field(
        default_factory=list,
        description="prompts (trace folders, RouteLLM CSVs); relative to the plan file",
    )
    n: int | None = Field(default=None, ge=1, description="prompts replayed; None = all")
    max_tokens: int | None = Field(default=None, ge=1, description="per request")
    concurrency: int | None = Field(default=None, ge=1, description="requests in flight")

    @model_validator(mode="after")
    def _combination_tiers(self) -> TrialPlan:
        names = {self.reference, *(c.tier for c in self.candidates)}
        if len(names) != 1 + len(self.candidates):
            raise ValueError("candidates: each tier once, and not the reference")
        return self

    def all_candidates(self) -> list[PlanCandidate]:
        """The candidates, then the combinations' tiers that are neither them nor the reference."""
        seen = {self.reference, *(c.tier for c in self.candidates)}
        extra = []
        for combo in self.combinations:
            for tier in (combo.small, combo.large):
                if tier not in seen:
                    seen.add(tier)
                    extra.append(PlanCandidate(tier=tier))
        return [*self.candidates, *extra]


def load_plan(path: Path) -> TrialPlan:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise PlanError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise PlanError(f"{path}: expected a mapping with `reference:` and `candidates:`")
    try:
        plan = TrialPlan.model_validate(doc)
    except ValidationError as exc:
        parts = [
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        ]
        raise PlanError(f"{path}: " + "; ".join(parts)) from None
    base = path.parent
    traces = [str(p if Path(p).is_absolute() else base / p) for p in plan.traces]
    return plan.model_copy(update={"traces": traces})


def check_tiers(plan: TrialPlan, tiers: set[str], source: str) -> None:
    """Every tier the plan names is configured; PlanError names the first key that is not."""
    keys = [("reference", plan.reference)]
    keys += [(f"candidates.{i}.tier", c.tier) for i, c in enumerate(plan.candidates)]
    for i, combo in enumerate(plan.combinations):
        keys += [(f"combinations.{i}.small", combo.small), (f"combinations.{i}.large", combo.large)]
    for key, tier in keys:
        if tier not in tiers:
            raise PlanError(
                f"{source}: {key}: unknown tier {tier!r} (configured: {', '.join(sorted(tiers))})"
            )
