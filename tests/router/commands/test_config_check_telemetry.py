"""`config check` says when `telemetry.enabled` needs the `otel` extra that is not installed,
before a proxy is started (the proxy says it too, at startup: router/proxy/build.py). The
environment without OpenTelemetry is a real interpreter in which importing it fails
(`sys.modules` entry None: Python's own way to make a package unimportable)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

RUN_CLI = "import sys; sys.modules['opentelemetry'] = None; from router.cli import app; app()"


def _config(path: Path, telemetry: dict[str, object]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "tiers": [
                    {
                        "name": "small",
                        "base_url": "http://127.0.0.1:9/v1",
                        "model": "m",
                        "price": {"input_per_mtok": 1, "output_per_mtok": 1},
                    }
                ],
                "telemetry": telemetry,
            }
        )
    )
    return path


def _check(config: Path, without_otel: bool) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", RUN_CLI] if without_otel else [sys.executable, "-m", "router.cli"]
    return subprocess.run(
        [*argv, "config", "check", str(config)], capture_output=True, text=True, timeout=120
    )


def test_config_check_names_the_missing_extra(tmp_path: Path) -> None:
    config = _config(tmp_path / "router.yaml", {"enabled": True})
    missing = _check(config, without_otel=True)
    assert missing.returncode == 2, missing.stderr
    assert "telemetry.enabled" in missing.stderr and str(config) in missing.stderr
    assert "pip install 'cost-router[otel]'" in missing.stderr
    assert "Traceback" not in missing.stderr
    installed = _check(config, without_otel=False)  # the dev install has the extra
    assert installed.returncode == 0, installed.stderr
    off = _check(_config(tmp_path / "off.yaml", {"enabled": False}), without_otel=True)
    assert off.returncode == 0, off.stderr  # tracing off needs nothing
