"""Shared helpers for the simulator tests: small real traces cut from the shared RouteLLM data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from classifiers.dataset import load_dataset, routellm_data_dir
from simulations.sim_config import SIMULATOR_DEFAULTS

GSM8K = routellm_data_dir() / "gsm8k" / "gsm8k_responses.csv"
PRICES = {"small": (0.6, 0.6), "large": (10.0, 30.0)}


def write_jsonl_trace(
    path: Path, n: int, seed: int = 0, teams: tuple[str, ...] = ("alpha", "beta"),
    rate_per_s: float = 5.0, start: float = 1_790_000_000.0,
) -> list[dict[str, Any]]:
    """n real GSM8K prompts with their real outcomes as trace-v1 records (sorted arrivals)."""
    ds = load_dataset([GSM8K])
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(ds), size=n, replace=False)
    times = start + np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    records = []
    for j, i in enumerate(pick.tolist()):
        records.append({
            "schema_version": 1,
            "id": f"req-{j}",
            "time": float(times[j]),
            "team": teams[j % len(teams)],
            "prompt": ds.prompts[i],
            "prompt_tokens": int(rng.integers(20, 400)),
            "completion_tokens": int(rng.integers(1, 300)),
            "outcomes": {"small": float(ds.small[i]), "large": float(ds.large[i])},
        })
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


def sim_config_dict(trace: Path | None = None, threshold: float = 0.3, **extra: Any) -> dict:
    data = json.loads(json.dumps(SIMULATOR_DEFAULTS))
    for tier in data["tiers"]:
        tier["replay_trace"] = str(trace) if trace else "-"
    data["policies"]["balanced"]["threshold"] = threshold
    data.update(extra)
    return data
