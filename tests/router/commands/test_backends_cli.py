"""`cost-router backends plan|launch|signals` through the real CLI app: the launch plan of a
config (or of the embedded demo), a bad launch profile, launch without vLLM, and a signals
snapshot polled from a real metrics endpoint. The planning itself (backends/launch.py) is tested
in tests/backends/test_launch.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from backends.signal_snapshots import load_snapshot
from router.cli import app
from tests.support.metrics_server import MetricsServer

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "gpu-node.yaml"


def test_cli_plan_prints_commands() -> None:
    result = CliRunner().invoke(app, ["backends", "plan", "--config", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "vllm serve meta-llama/Llama-3.3-70B-Instruct" in result.output
    assert "--speculative-config" in result.output
    assert "# tier small (vllm)" in result.output


def test_cli_plan_without_config_shows_the_embedded_demo() -> None:
    result = CliRunner().invoke(app, ["backends", "plan"])
    assert result.exit_code == 0, result.output
    assert result.output.count("-m llama_cpp.server") == 2
    assert "--draft_model prompt-lookup-decoding" in result.output  # the demo's large tier
    assert "metrics none (readiness from /v1/models only)" in result.output


def test_cli_plan_bad_profile_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "tiers:\n  - name: big\n    base_url: http://h:8000/v1\n    model: m\n"
        "    price: {input_per_mtok: 1, output_per_mtok: 1}\n"
        "    launch: {model: org/m, speculative: {method: eagle3}}\n"
    )
    result = CliRunner().invoke(app, ["backends", "plan", "--config", str(cfg)])
    assert result.exit_code == 2  # bad input (router/commands/common.py)
    assert "tiers.0.launch" in result.output and "speculative.draft_model" in result.output


def test_cli_launch_refuses_when_vllm_is_absent() -> None:
    # vLLM is not installed in this environment (no GPU): launch must say so and start nothing.
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    result = CliRunner().invoke(app, ["backends", "launch", "--config", str(EXAMPLE)])
    assert result.exit_code == 1
    assert "vllm is not installed" in result.output


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
