"""The router config the simulator replays, and writing a tuned threshold back into it.

Without a config file the simulator uses the prices of the shared RouteLLM data's README (large
$10/$30, small $0.60/$0.60 per million tokens) and one `threshold` policy, so `cost-router tune`
works on the data out of the box.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from policies.registry import parse_params
from router.config import ConfigError, RouterConfig, config_from_dict, load_config

DEFAULT_POLICY = "balanced"

SIMULATOR_DEFAULTS: dict[str, Any] = {
    "tiers": [
        {
            "name": "small",
            "kind": "replay",
            "model": "small",
            "replay_trace": "-",
            "price": {"input_per_mtok": 0.6, "output_per_mtok": 0.6},
        },
        {
            "name": "large",
            "kind": "replay",
            "model": "large",
            "replay_trace": "-",
            "price": {"input_per_mtok": 10.0, "output_per_mtok": 30.0},
        },
    ],
    "default_policy": DEFAULT_POLICY,
    "policies": {
        DEFAULT_POLICY: {"type": "threshold", "small": "small", "large": "large", "threshold": 0.5}
    },
    "traces": {"path": None},
}


def sim_config(path: str | Path | None) -> RouterConfig:
    return (
        load_config(path)
        if path is not None
        else config_from_dict(SIMULATOR_DEFAULTS, source="simulator defaults")
    )


def write_threshold(path: str | Path, policy: str | None, threshold: float) -> str:
    """Set `policies.<policy>.threshold` in the YAML file; returns the policy name written.

    The edited document is validated as a whole before the file is replaced. YAML comments are
    not preserved (PyYAML does not keep them).
    """
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    name = policy or data.get("default_policy") or DEFAULT_POLICY
    policies = data.setdefault("policies", {}) or {}
    data["policies"] = policies
    entry = policies.setdefault(name, {"type": "threshold"})
    if entry.get("type") not in ("threshold", "budget_pacing"):
        raise ConfigError(f"{p}: policies.{name} has type {entry.get('type')!r}: no threshold")
    entry.pop("target_large_share", None)  # a fixed threshold replaces a target share
    entry["threshold"] = round(float(threshold), 6)
    config = config_from_dict(data, source=str(p))
    parse_params(name, config.policies[name])
    p.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return name


def describe_prices(config: RouterConfig) -> str:
    return ", ".join(
        f"{t.name} ${t.price.input_per_mtok:g}/${t.price.output_per_mtok:g}" for t in config.tiers
    )
