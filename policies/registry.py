"""Config -> policy objects: the one list of policy types, driving validation and building.

`SPECS` maps each `type:` a config may name to its PolicySpec (params model and builder, defined
in the type's own module). Adding a policy type is one new module (the policy class, its params
model, a `build` function and `SPEC`) plus its SPECS line here (and its name in the import);
`PolicyConfig.type` accepts exactly the names listed, and tests/policies/
test_policy_conformance.py runs its checks on every one (it fails until the type has an example).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from policies import budget_pacing, fixed, random_split, threshold, tiers
from policies.base import Policy
from policies.config import ConfigError, PolicyConfig
from policies.spec import (
    Builder,
    PolicyEnv,
    PolicyParams,
    PolicySpec,
    card_threshold,
    tiers_by_price,
)

# PolicyEnv and tiers_by_price live in policies/spec.py; callers of build_policies get them here.
__all__ = ["SPECS", "PolicyEnv", "build_policies", "default_policy", "parse_params",
           "tiers_by_price", "validate_policy_params"]

SPECS: dict[str, PolicySpec] = {
    "threshold": threshold.SPEC,
    "budget_pacing": budget_pacing.SPEC,
    "tiers": tiers.SPEC,
    "fixed": fixed.SPEC,
    "random": random_split.SPEC,
}


def parse_params(name: str, policy: PolicyConfig) -> PolicyParams:
    """Validate one policy's params (no file access); ConfigError names `policies.<name>.<key>`."""
    spec = SPECS.get(policy.type)
    if spec is None:
        raise ConfigError(
            f"policies.{name}.type: unknown policy type {policy.type!r} (known: {sorted(SPECS)})"
        )
    try:
        return spec.params.model_validate(policy.model_dump())
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"])
            key = f"policies.{name}.{loc}" if loc else f"policies.{name}"
            lines.append(f"{key}: {e['msg']}")
        raise ConfigError("; ".join(lines)) from None


def validate_policy_params(policies: Mapping[str, PolicyConfig]) -> None:
    for name, policy in policies.items():
        parse_params(name, policy)


def default_policy(env: PolicyEnv) -> Policy:
    """The policy used when none is configured: cheapest vs priciest tier, at the classifier
    card's threshold."""
    order = tiers_by_price(env.prices)
    if len(order) == 1:
        return fixed.FixedPolicy(env.default_policy, order[0])
    card = card_threshold(env.model_path)
    return threshold.ThresholdPolicy(env.default_policy, order[0], order[-1], card)


def build_policies(policies: Mapping[str, PolicyConfig], env: PolicyEnv) -> dict[str, Policy]:
    """Every configured policy by name; raises ConfigError naming the offending key."""
    if not policies:
        return {env.default_policy: default_policy(env)}
    cache: dict[tuple[str, bool], Any] = {}
    built: dict[str, Policy] = {}
    for name, policy in policies.items():
        params = parse_params(name, policy)
        built[name] = SPECS[policy.type].build(Builder(name, env, cache), params)
    return built
