"""Measured signals feed the what-if simulator: from a saved snapshot or polled live. The commands
(`what-if --signals`, `backends signals --save`) are tested in tests/router/commands/."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.config import SignalsConfig
from backends.metrics_scrape import parse_metrics
from backends.signal_snapshots import save_snapshot
from backends.tier_signals import TierSignals, derive
from router.config import config_from_dict
from simulations.latency import TierLatency, spec_speedup, with_speculative
from simulations.signal_levers import apply_measurements, measured_levers, measured_tiers
from simulations.whatif import Levers
from tests.support.metrics_server import FIRST, LATER, MetricsServer

LEVERS = Levers(small=TierLatency(0.12, 0.008, 16), large=TierLatency(0.4, 0.025, 16), spec_k=5)


def measured_large() -> TierSignals:
    return derive("large", parse_metrics(LATER), parse_metrics(FIRST), 2.0, now=1.0)


def test_simulator_view_keeps_only_tiers_with_metrics() -> None:
    snapshot = {"large": measured_large(), "small": TierSignals("small", "no_metrics", True)}
    measured = measured_tiers(snapshot)
    assert set(measured) == {"large"}  # a tier without metrics measured nothing
    assert measured["large"].spec_acceptance == pytest.approx(0.75)
    assert measured["large"].tpot_s == pytest.approx(0.01)


def test_measured_values_replace_assumptions_without_double_counting_speculation() -> None:
    snapshot = {"large": measured_large(), "small": TierSignals("small", "no_metrics", True)}
    levers, notes = apply_measurements(LEVERS, snapshot, "small", "large")
    assert levers.spec_acceptance == pytest.approx(0.75)
    assert levers.large.ttft_s == pytest.approx(0.3)
    # measured 10 ms/token WITH speculation: the baseline is the plain decode time ...
    assert levers.large.per_token_s == pytest.approx(0.01 * spec_speedup(0.75, 5, 0.0))
    # ... so applying the speculative lever gives back exactly what was measured.
    spec_on = with_speculative(levers.large, levers.spec_acceptance, 5, levers.draft_cost)
    assert spec_on.per_token_s == pytest.approx(0.01)
    assert levers.small == LEVERS.small  # no metrics: assumptions kept, and said so
    assert any("not measured" in n and "small" in n for n in notes)
    assert any(n.startswith("large:") and "[measured]" in n for n in notes)


def test_tier_without_speculation_keeps_its_measured_decode_time() -> None:
    plain = TierSignals("small", "ok", True, 1.0, ttft_s=0.05, tpot_s=0.004)
    levers, _ = apply_measurements(LEVERS, {"small": plain}, "small", "large")
    assert (levers.small.ttft_s, levers.small.per_token_s) == (0.05, 0.004)
    assert levers.large == LEVERS.large and levers.spec_acceptance == LEVERS.spec_acceptance


def test_live_source_polls_the_configs_tiers() -> None:
    server = MetricsServer()
    try:
        root = f"http://127.0.0.1:{server.port}"
        config = config_from_dict(
            {
                "tiers": [
                    {
                        "name": "small",
                        "base_url": f"{root}/v1",
                        "model": "s",
                        "price": {"input_per_mtok": 0.6, "output_per_mtok": 0.6},
                    },
                    {
                        "name": "large",
                        "base_url": f"{root}/v1",
                        "model": "l",
                        "metrics_url": f"{root}/metrics",
                        "price": {"input_per_mtok": 10, "output_per_mtok": 30},
                    },
                ],
                "signals": {"interval_s": 0.05},
            }
        )
        # Between the two live polls the counters do not move: gauges, but no rates yet.
        levers, notes = measured_levers(LEVERS, config.tiers, "live", config.signals)
        assert levers == LEVERS
        assert any("large: metrics but no finished requests" in n for n in notes)
    finally:
        server.close()


def test_draft_length_comes_from_the_large_tiers_launch_profile(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "gpu-node.yaml"
    from router.config import load_config

    snap = tmp_path / "snap.json"
    save_snapshot(snap, {"large": measured_large()})
    levers, notes = measured_levers(
        Levers(small=LEVERS.small, large=LEVERS.large, spec_k=2),
        load_config(example).tiers,
        str(snap),
        SignalsConfig(),
    )
    assert levers.spec_k == 5  # gpu-node.yaml: num_speculative_tokens 5
    assert levers.large.per_token_s == pytest.approx(0.01 * spec_speedup(0.75, 5, 0.0))
    assert notes[0] == "large: draft length k=5 from its launch profile"
