"""Measured signals feed the what-if simulator: from a saved snapshot or polled live."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from backends.config import SignalsConfig
from backends.metrics_scrape import parse_metrics
from backends.signal_snapshots import load_snapshot, save_snapshot
from backends.tier_signals import TierSignals, derive
from router.cli import app
from router.config import config_from_dict
from simulations.latency import TierLatency, spec_speedup, with_speculative
from simulations.signal_levers import apply_measurements, measured_levers, measured_tiers
from simulations.whatif import Levers
from tests.support.metrics_server import FIRST, LATER, MetricsServer
from tests.support.sim import write_jsonl_trace

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


def test_what_if_cli_takes_a_saved_snapshot(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    write_jsonl_trace(trace, 30)
    snap = tmp_path / "signals.json"
    save_snapshot(snap, {"large": measured_large()})
    result = CliRunner().invoke(app, ["what-if", "--traces", str(trace), "--signals", str(snap)])
    assert result.exit_code == 0, result.output
    assert "large: ttft 300.0 ms per-token 10.00 ms spec acceptance 0.750" in result.output
    assert "acceptance 0.75" in result.output  # the what-if report uses the measured rate

    bad = CliRunner().invoke(
        app, ["what-if", "--traces", str(trace), "--signals", str(tmp_path / "none.json")]
    )
    assert bad.exit_code == 2 and "cannot read signals snapshot" in bad.output


def test_backends_signals_cli_saves_a_snapshot(tmp_path: Path) -> None:
    server = MetricsServer()
    try:
        root = f"http://127.0.0.1:{server.port}"
        config_file = tmp_path / "router.yaml"
        config_file.write_text(
            "tiers:\n"
            f"  - {{name: large, base_url: '{root}/v1', model: l, metrics_url: '{root}/metrics',"
            " price: {input_per_mtok: 10, output_per_mtok: 30}}\n"
        )
        snap = tmp_path / "snap.json"
        args = ["backends", "signals", "--config", str(config_file), "--interval", "0.05"]
        args += ["--save", str(snap)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "large: ok" in result.output and "waiting=12" in result.output
        assert load_snapshot(snap)["large"].waiting == 12.0
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
