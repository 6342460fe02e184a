"""Shared helpers for the simulator tests: small real traces cut from the shared RouteLLM data, the
simulator's config, and router configs (YAML documents) for the commands and the live proxy."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from backends.config import Price
from classifiers.dataset import load_dataset, routellm_data_dir
from policies.config import BudgetsConfig, PolicyConfig, TeamConfig
from policies.registry import PolicyEnv
from simulations.sim_config import DEFAULT_POLICY, SimConfig

GSM8K = routellm_data_dir() / "gsm8k" / "gsm8k_responses.csv"
PRICES = {"small": (0.6, 0.6), "large": (10.0, 30.0)}  # the simulator's defaults


def write_jsonl_trace(
    path: Path,
    n: int,
    seed: int = 0,
    teams: tuple[str, ...] = ("alpha", "beta"),
    rate_per_s: float = 5.0,
    start: float = 1_790_000_000.0,
) -> list[dict[str, Any]]:
    """n real GSM8K prompts with their real outcomes as trace-v1 records (sorted arrivals)."""
    ds = load_dataset([GSM8K])
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(ds), size=n, replace=False)
    times = start + np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    records = []
    for j, i in enumerate(pick.tolist()):
        records.append(
            {
                "schema_version": 1,
                "id": f"req-{j}",
                "time": float(times[j]),
                "team": teams[j % len(teams)],
                "prompt": ds.prompts[i],
                "prompt_tokens": int(rng.integers(20, 400)),
                "completion_tokens": int(rng.integers(1, 300)),
                "outcomes": {"small": float(ds.small[i]), "large": float(ds.large[i])},
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


def balanced(threshold: float) -> dict[str, Any]:
    """The `balanced` threshold policy between the two default tiers."""
    return {"type": "threshold", "small": "small", "large": "large", "threshold": threshold}


def sim_config(
    threshold: float = 0.3,
    *,
    policies: Mapping[str, dict[str, Any]] | None = None,
    teams: Mapping[str, dict[str, Any]] | None = None,
    budgets: dict[str, Any] | None = None,
    prices: Mapping[str, tuple[float, float]] = PRICES,
) -> SimConfig:
    """The simulator's config: `balanced` at `threshold`, plus the sections given (as in YAML)."""
    return SimConfig(
        env=PolicyEnv(
            {n: Price(input_per_mtok=i, output_per_mtok=o) for n, (i, o) in prices.items()},
            DEFAULT_POLICY,
        ),
        policies={
            name: PolicyConfig.model_validate(p)
            for name, p in {DEFAULT_POLICY: balanced(threshold), **(policies or {})}.items()
        },
        teams={name: TeamConfig.model_validate(t) for name, t in (teams or {}).items()},
        budgets=BudgetsConfig.model_validate(budgets or {}),
    )


def router_config_dict(trace: Path | None = None, threshold: float = 0.3, **extra: Any) -> dict:
    """A router config document with the default prices and `balanced` policy. With `trace`, its
    tiers are replay backends answering from it (for the live proxy); without, OpenAI-compatible
    tiers at addresses nothing calls (the simulator reads only their prices)."""

    def tier(name: str) -> dict[str, Any]:
        price = {"input_per_mtok": PRICES[name][0], "output_per_mtok": PRICES[name][1]}
        if trace is not None:
            return {
                "name": name,
                "kind": "replay",
                "model": name,
                "replay_trace": str(trace),
                "price": price,
            }
        return {
            "name": name,
            "base_url": f"http://{name}.invalid/v1",
            "model": name,
            "price": price,
        }

    return {
        "tiers": [tier("small"), tier("large")],
        "default_policy": DEFAULT_POLICY,
        "policies": {DEFAULT_POLICY: balanced(threshold)},
        "traces": {"path": None},
        **extra,
    }
