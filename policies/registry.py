"""Config -> policy objects: the one list of policy types, driving validation and building.

`SPECS` maps each `type:` a config may name to its PolicySpec (params model and builder, defined
in the type's own module). Adding a policy type is one new module (the policy class, its params
model, a `build` function and `SPEC`) plus its SPECS line here (and its name in the import);
`PolicyConfig.type` accepts exactly the names listed, and tests/policies/
test_policy_conformance.py runs its checks on every one (it fails until the type has an example).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from policies import budget_pacing, fixed, random_split, threshold, tiers
from policies.base import Policy
from policies.config import ExperimentConfig, KeyConfig, PolicyConfig, TeamConfig
from policies.sessions.config import DEFAULT_SESSION, SessionParams
from policies.spec import (
    Builder,
    PolicyEnv,
    PolicyParams,
    PolicySpec,
    card_threshold,
    tiers_by_price,
)
from policies.workflow import Workflow, build_workflows
from trace_format.config_base import ConfigError

# PolicyEnv and tiers_by_price live in policies/spec.py; callers of build_policies get them here.
__all__ = [
    "SPECS",
    "PolicyEnv",
    "build_policies",
    "default_policy",
    "parse_params",
    "session_settings",
    "workflow_settings",
    "tiers_by_price",
    "validate_policy_params",
]

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
        # model_path is every type's (the classifier it scores with, PolicyEnv.model_path).
        return spec.params.model_validate(policy.model_dump(exclude={"model_path"}))
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


def check_routing(
    policies: Mapping[str, PolicyConfig],
    default_policy: str,
    tiers: Collection[str],
    teams: Mapping[str, TeamConfig] | None = None,
    keys: Sequence[KeyConfig] = (),
    experiments: Sequence[ExperimentConfig] = (),
) -> None:
    """Every reference between the routing sections resolves and every policy's params are valid
    (no file is read); ConfigError names the key. The router's config and the simulator's both
    check with this."""
    if policies and default_policy not in policies:
        raise ConfigError(f"default_policy: {default_policy!r} is not in policies")
    # With no policies configured, the default policy is built in (default_policy below).
    known = set(policies) or {default_policy}
    for name, team in (teams or {}).items():
        if team.policy and team.policy not in known:
            raise ConfigError(f"teams.{name}.policy names unknown policy {team.policy!r}")
    for i, key in enumerate(keys):
        if key.policy and key.policy not in known:
            raise ConfigError(f"keys[{i}].policy names unknown policy {key.policy!r}")
    names = [e.name for e in experiments]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"experiments: duplicate experiment names: {dupes}")
    for i, exp in enumerate(experiments):
        for arm, spec in exp.arms.items():
            if spec.policy not in known:
                raise ConfigError(
                    f"experiments[{i}].arms.{arm}.policy names unknown policy {spec.policy!r}"
                )
    for name, pol in policies.items():
        for field in ("small", "large", "tier"):
            ref = (pol.model_extra or {}).get(field)
            if isinstance(ref, str) and ref not in tiers:
                raise ConfigError(f"policies.{name}.{field} names unknown tier {ref!r}")
    for name, pol in policies.items():
        for i, wf in enumerate(parse_params(name, pol).workflows):
            for field in ("tier", "teacher"):
                ref = getattr(wf, field)
                if ref is not None and ref not in tiers:
                    raise ConfigError(
                        f"policies.{name}.workflows.{i}.{field} names unknown tier {ref!r}"
                    )


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
    cache: dict[tuple[str, bool, str | None], Any] = {}
    built: dict[str, Policy] = {}
    for name, policy in policies.items():
        params = parse_params(name, policy)
        # A policy with its own model takes its card threshold and rescores with that model.
        own = env if policy.model_path is None else replace(env, model_path=policy.model_path)
        built[name] = SPECS[policy.type].build(Builder(name, own, cache), params)
    return built


def session_settings(policies: Mapping[str, PolicyConfig]) -> dict[str, SessionParams]:
    """Each configured policy's `session:` option (the default where it sets none); the
    built-in default policy, when none is configured, takes the default. Raises ConfigError."""
    return {
        name: parse_params(name, policy).session or DEFAULT_SESSION
        for name, policy in policies.items()
    }


def workflow_settings(
    policies: Mapping[str, PolicyConfig], built: Mapping[str, Policy]
) -> dict[str, tuple[Workflow, ...]]:
    """Each configured policy's `workflows:` (only policies that set some), their teacher
    defaulting to the policy's priciest tier. Raises ConfigError."""
    out: dict[str, tuple[Workflow, ...]] = {}
    for name, policy in policies.items():
        entries = parse_params(name, policy).workflows
        if entries and name in built:
            out[name] = build_workflows(entries, name, built[name].tiers()[-1])
    return out
