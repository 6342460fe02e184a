"""A port already in use: `cost-router serve` (with a config, and the demo) and the echo/fault
upstreams say so in one `error:` line naming the port and how to choose another, exit 2, and
start nothing (the demo's llama.cpp servers are never launched)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from router.server.demo import DEMO_TIER_PORTS
from tests.support.ports import free_port
from tests.support.proxy import tier

REPO = Path(__file__).resolve().parents[3]
CONFIG = {
    "tiers": [tier("small", "http://127.0.0.1:9/v1"), tier("large", "http://127.0.0.1:9/v1")],
    "traces": {"path": None},
}


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something is listening on for the test's duration."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


def assert_one_error_line(res: subprocess.CompletedProcess[str], port: int, *hints: str) -> None:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    assert f"port {port} " in errors[0] and "in use" in errors[0]
    for hint in hints:
        assert hint in errors[0]


def test_serve_with_a_config_on_a_taken_port_is_one_line_exit_2(
    tmp_path: Path, taken_port: int
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "server": {"port": taken_port}}))
    res = run(["-m", "router.cli", "serve", "-c", str(path)], tmp_path)
    assert_one_error_line(res, taken_port, "--port", "server.port", "COST_ROUTER__SERVER__PORT")
    # The port from --port and from the environment is checked too.
    path.write_text(yaml.safe_dump(CONFIG))
    res = run(["-m", "router.cli", "serve", "-c", str(path), "--port", str(taken_port)], tmp_path)
    assert_one_error_line(res, taken_port)
    res = run(
        ["-m", "router.cli", "serve", "-c", str(path)],
        tmp_path,
        COST_ROUTER__SERVER__PORT=str(taken_port),
    )
    assert_one_error_line(res, taken_port)


def test_demo_on_a_taken_port_starts_no_server(tmp_path: Path, taken_port: int) -> None:
    res = run(["-m", "router.cli", "serve", "--port", str(taken_port)], tmp_path)
    assert_one_error_line(res, taken_port, "--port")
    assert "starting two llama.cpp servers" not in res.stdout  # checked before anything starts


@pytest.mark.parametrize("module", ["benchmarks.echo_upstream", "benchmarks.fault_upstream"])
def test_upstreams_on_a_taken_port_are_one_line_exit_2(
    tmp_path: Path, taken_port: int, module: str
) -> None:
    res = run(["-m", module, "--port", str(taken_port)], tmp_path)
    assert_one_error_line(res, taken_port, "--port")


def test_backends_plan_shows_the_ports_the_demo_listens_on(tmp_path: Path) -> None:
    """`backends plan` without a config plans the demo: the ports it prints are the ones the
    demo's servers take (the demo reports the one in use rather than picking another)."""
    plan = run(["-m", "router.cli", "backends", "plan"], tmp_path)
    assert plan.returncode == 0, plan.stderr
    ports = [int(p) for p in re.findall(r"--port (\d+)", plan.stdout)]
    assert ports == list(DEMO_TIER_PORTS)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", ports[0]))
            s.listen(1)
        except OSError:
            pass  # already taken by something else: the demo must report it all the same
        proxy = free_port()
        res = run(["-m", "router.cli", "serve", "--port", str(proxy)], tmp_path)
    assert_one_error_line(res, ports[0], "the demo's small tier", "--port 0")
