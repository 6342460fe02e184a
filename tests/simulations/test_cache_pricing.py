"""The simulator prices a trace's recorded prompt-cache breakdown (issue 23, item 5): a record's
cached and written tokens at the cache prices of the tier that recorded them, to the nano of the
proxy's own formula; on another tier that cache was not there, so the prompt is fresh; a trace
without the fields, or tiers without cache prices, cost what they did before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.config import Price
from policies.config import PolicyConfig
from policies.registry import PolicyEnv
from simulations.budget_replay import budget_replay
from simulations.replay import TierPrices, replay, role_costs, trace_scores
from simulations.sim_config import SimConfig
from simulations.trace_loader import load_trace

SMALL = Price(input_per_mtok=0.5, output_per_mtok=1.5, cached_input_per_mtok=0.05)
LARGE = Price(
    input_per_mtok=3.0, output_per_mtok=15.0, cached_input_per_mtok=0.3, cache_write_per_mtok=3.75
)
# (tier that served it, prompt, completion, cached, written); None: fields not recorded.
RECORDS: list[tuple[str, int, int, int | None, int | None]] = [
    ("large", 1200, 40, 1024, 0),
    ("large", 900, 10, 0, 896),
    ("small", 300, 7, 256, None),
    ("large", 80, 20, None, None),
]


def _trace(path: Path, records: list[tuple[str, int, int, int | None, int | None]]) -> Path:
    lines = []
    for i, (tier, prompt, completion, cached, written) in enumerate(records):
        record: dict[str, Any] = {
            "schema_version": 1,
            "id": f"r{i}",
            "time": 1_790_000_000.0 + i,
            "team": "t",
            "prompt": f"question number {i} about caches",
            "tier": tier,
            "tiers_tried": [tier],
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "outcomes": {"small": 0.5, "large": 1.0},
        }
        if cached is not None:
            record["cached_tokens"] = cached
        if written is not None:
            record["cache_write_tokens"] = written
        lines.append(json.dumps(record) + "\n")
    path.write_text("".join(lines), encoding="utf-8")
    return path


def _sim(tier: str, prices: dict[str, Price] | None = None) -> SimConfig:
    return SimConfig(
        env=PolicyEnv(prices or {"small": SMALL, "large": LARGE}, "pinned"),
        policies={"pinned": PolicyConfig.model_validate({"type": "fixed", "tier": tier})},
    )


def _nanos(cost_usd: np.ndarray) -> list[int]:
    return [round(c * 1e9) for c in cost_usd.tolist()]


def _replayed(path: Path, tier: str, prices: dict[str, Price] | None = None) -> list[int]:
    trace = load_trace([path])
    return _nanos(replay(_sim(tier, prices), trace, trace_scores(trace, None)).cost_usd)


def test_recorded_cached_tokens_are_priced_on_the_tier_that_cached_them(tmp_path: Path) -> None:
    path = _trace(tmp_path / "t.jsonl", RECORDS)
    on_large = [
        LARGE.cost_nanos(1200, 40, 1024, 0),  # cache read at 10%
        LARGE.cost_nanos(900, 10, 0, 896),  # cache write at 125%
        LARGE.cost_nanos(300, 7),  # the small tier's cache: fresh on large
        LARGE.cost_nanos(80, 20),  # nothing recorded: fresh
    ]
    assert _replayed(path, "large") == on_large
    # By hand, the first: 176 fresh x $3 + 1024 cached x $0.30 + 40 out x $15 (per Mtok).
    assert on_large[0] == 176 * 3000 + 1024 * 300 + 40 * 15000
    assert _replayed(path, "small") == [
        SMALL.cost_nanos(1200, 40),
        SMALL.cost_nanos(900, 10),
        SMALL.cost_nanos(300, 7, 256),
        SMALL.cost_nanos(80, 20),
    ]


def test_without_cache_prices_or_breakdown_the_cost_is_as_before(tmp_path: Path) -> None:
    plain = {
        "small": Price(input_per_mtok=0.5, output_per_mtok=1.5),
        "large": Price(input_per_mtok=3.0, output_per_mtok=15.0),
    }
    path = _trace(tmp_path / "t.jsonl", RECORDS)
    two_term = [round(float(p * 3.0 * 1000 + c * 15.0 * 1000)) for _, p, c, _, _ in RECORDS]
    assert _replayed(path, "large", plain) == two_term
    bare = _trace(tmp_path / "bare.jsonl", [(t, p, c, None, None) for t, p, c, _, _ in RECORDS])
    assert load_trace([bare]).cache is None
    assert _replayed(bare, "large") == two_term


def test_baselines_and_budget_replay_price_the_breakdown_too(tmp_path: Path) -> None:
    trace = load_trace([_trace(tmp_path / "t.jsonl", RECORDS)])
    prices = TierPrices.from_prices({"small": SMALL, "large": LARGE})
    costs = role_costs(prices, trace.prompt_tokens, trace.completion_tokens, trace.cache)
    assert _nanos(costs[:, 1])[0] == LARGE.cost_nanos(1200, 40, 1024, 0)
    assert _nanos(costs[:, 0])[2] == SMALL.cost_nanos(300, 7, 256)
    tallies = budget_replay(_sim("large"), trace, trace_scores(trace, None))
    spent = [
        LARGE.cost_nanos(1200, 40, 1024, 0),
        LARGE.cost_nanos(900, 10, 0, 896),
        LARGE.cost_nanos(300, 7),
        LARGE.cost_nanos(80, 20),
    ]
    assert tallies["t"].spent_usd == pytest.approx(sum(spent) / 1e9, abs=1e-12)
