"""Context windows in the simulator (issue 23, item 4): a record the chosen tier cannot hold is
routed as the proxy routes it (policies/context_window.py `fit_tier`, the same function): to the
cheapest tier of the policy that holds it, or refused (no cost, quality 0) when none does."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from router.config import config_from_dict, sim_config_from
from simulations.context_fit import record_tokens
from simulations.replay import replay, score_texts, sweep_inputs, trace_scores, two_tier_policy
from simulations.sim_config import SimConfig, defaults_document
from simulations.stream import stream_replay
from simulations.synth import SynthSpec, pool_from_trace, write_synthetic
from simulations.trace import ReplayTrace
from simulations.trace_loader import load_trace
from tests.support.sim import GSM8K, sim_config
from trace_format.config_base import ConfigError

SCORES = np.asarray([0.1, 0.1, 0.9, 0.1, 0.1])
PROMPT = np.asarray([500, 950, 950, 1_900, 3_000])
COMPLETION = np.asarray([[100, 100], [100, 200], [50, 50], [50, 300], [10, 10]])


def trace() -> ReplayTrace:
    n = len(SCORES)
    return ReplayTrace(
        texts=[f"prompt {i}" for i in range(n)],
        quality=np.stack([np.full(n, 0.25), np.full(n, 0.75)], axis=1),
        prompt_tokens=PROMPT,
        completion_tokens=COMPLETION,
    )


def usd(prompt: int, completion: int, price: tuple[float, float]) -> float:
    return (prompt * price[0] + completion * price[1]) / 1e6


def test_a_record_too_long_for_the_small_tier_is_replayed_on_the_large_one() -> None:
    sim = replace(sim_config(threshold=0.5), context_windows={"small": 1_000, "large": 2_000})
    result = replay(sim, trace(), SCORES)
    # need = prompt + the longer answer: 600 fits small; 1150 small no, large yes; row 2 is
    # large by score; 2200 and 3010 fit neither: refused.
    assert result.tiers == ["small", "large"]
    assert result.tier_idx[:3].tolist() == [0, 1, 1]
    assert result.moved.tolist() == [False, True, False, False, False]
    assert result.refused.tolist() == [False, False, False, True, True]
    small, large = (0.6, 0.6), (10.0, 30.0)
    expected = [usd(500, 100, small), usd(950, 200, large), usd(950, 50, large), 0.0, 0.0]
    assert result.cost_usd.tolist() == pytest.approx(expected, abs=1e-9)
    assert result.quality.tolist() == [0.25, 0.75, 0.75, 0.0, 0.0]  # refused: no answer
    summary = result.summary()
    assert summary["context_window_moved"] == 1 and summary["context_window_refused"] == 2
    assert summary["share"] == {"small": 0.2, "large": 0.4}  # of all 5; 2 refused


def test_without_windows_the_replay_is_unchanged() -> None:
    plain = replay(sim_config(threshold=0.5), trace(), SCORES)
    assert plain.moved is None and plain.refused is None
    assert plain.tier_idx.tolist() == [0, 0, 1, 0, 0]
    assert "context_window_moved" not in plain.summary()


def test_the_windows_come_from_the_router_config_and_the_simulator_document() -> None:
    config = config_from_dict(
        {
            "tiers": [
                {
                    "name": "small",
                    "base_url": "http://127.0.0.1:1/v1",
                    "model": "s",
                    "price": {"input_per_mtok": 0.6, "output_per_mtok": 0.6},
                    "context_window": 4_096,
                },
                {
                    "name": "large",
                    "base_url": "http://127.0.0.1:1/v1",
                    "model": "l",
                    "price": {"input_per_mtok": 10, "output_per_mtok": 30},
                },
            ]
        },
        environ={},
    )
    assert sim_config_from(config).context_windows == {"small": 4_096, "large": None}
    doc = defaults_document()
    doc["tiers"][0]["context_window"] = 8_192
    windows = SimConfig.from_document(doc, "doc").context_windows
    assert windows[doc["tiers"][0]["name"]] == 8_192
    doc["tiers"][0]["context_window"] = 0
    with pytest.raises(ConfigError, match=r"doc: tiers\.0\.context_window: expected an integer"):
        SimConfig.from_document(doc, "doc")


def test_the_threshold_sweep_sees_what_the_proxy_serves() -> None:
    """tune's inputs: a record the small tier cannot hold costs and scores as the large one on
    the small side; one no tier holds is refused on both sides (no cost, quality 0)."""
    sim = replace(sim_config(threshold=0.5), context_windows={"small": 1_000, "large": 2_000})
    policy = two_tier_policy(sim, None)
    inputs = sweep_inputs(sim.prices, trace(), SCORES, policy, sim.context_windows)
    small, large = (0.6, 0.6), (10.0, 30.0)
    assert inputs.cost_small.tolist() == pytest.approx(
        [usd(500, 100, small), usd(950, 200, large), usd(950, 50, small), 0.0, 0.0], abs=1e-9
    )
    assert inputs.cost_large.tolist() == pytest.approx(
        [usd(500, 100, large), usd(950, 200, large), usd(950, 50, large), 0.0, 0.0], abs=1e-9
    )
    assert inputs.quality_small.tolist() == [0.25, 0.75, 0.25, 0.0, 0.0]
    assert inputs.quality_large.tolist() == [0.75, 0.75, 0.75, 0.0, 0.0]
    plain = sweep_inputs(sim.prices, trace(), SCORES, policy)
    assert plain.cost_small[1] == pytest.approx(usd(950, 100, small))


def test_the_streaming_replay_applies_the_windows_as_the_in_memory_one(tmp_path: Path) -> None:
    pool = pool_from_trace(load_trace([GSM8K]))
    path = tmp_path / "t.parquet"
    write_synthetic(pool, SynthSpec(rows=3_000, rate_per_s=20, teams=3, seed=5), path)
    trace = load_trace([path])
    tokens = record_tokens(trace.prompt_tokens, trace.completion_tokens)
    small, large = np.percentile(tokens, [50, 95]).astype(int).tolist()
    sim = replace(sim_config(threshold=0.9), context_windows={"small": small, "large": large})
    scores = trace_scores(trace, sim.model_path)
    full = replay(sim, trace, scores)
    assert full.moved is not None and full.refused is not None
    assert full.moved.sum() > 0 and full.refused.sum() > 0
    s = stream_replay(sim, path, lambda t: score_texts(t, None), batch_rows=1_000).summary()
    expected = full.summary()
    assert s["context_window_moved"] == expected["context_window_moved"]
    assert s["context_window_refused"] == expected["context_window_refused"]
    assert s["share"] == pytest.approx(expected["share"])
    assert s["cost_usd"] == pytest.approx(full.cost_usd.sum(), rel=1e-9)
    assert s["quality"] == pytest.approx(full.quality.mean(), rel=1e-9)
