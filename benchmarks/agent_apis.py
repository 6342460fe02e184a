"""The agent APIs' overhead: a request to POST /v1/responses or /v1/messages (translated to chat
completions and back) beside the same request to /v1/chat/completions, one proxy, one echo
upstream, measured alternately in one run so machine load hits every endpoint alike.

Per endpoint and mode (non-stream, stream): closed loop (64 clients) sustained req/s and the
proxy's CPU ms per request; open loop at --rate: p50 / p99 (TTFB when streaming) added over
calling the upstream directly, and the translated endpoints' p50 and CPU beside chat's.

    .venv/bin/python benchmarks/agent_apis.py [--rounds 3] [--rate 200] [--seconds 5]
    .venv/bin/python benchmarks/agent_apis.py --passthrough   # + responses passed through
    .venv/bin/python benchmarks/agent_apis.py --rounds 1 --seconds 1 --rate 50   # smoke

An endpoint the tree does not serve (404) is left out and said so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import proxy_overhead as po  # noqa: E402
import yaml  # noqa: E402

MAX_TOKENS = 16
JSON = {"content-type": "application/json"}
# The same request in each API: one user turn, the same completion bound, the router's choice.
ENDPOINTS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        JSON,
        {
            "model": "auto",
            "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": po.PROMPT}],
        },
    ),
    "responses": (
        "/v1/responses",
        JSON,
        {"model": "auto", "max_output_tokens": MAX_TOKENS, "input": po.PROMPT},
    ),
    "messages": (
        "/v1/messages",
        {**JSON, "anthropic-version": "2023-06-01"},
        {
            "model": "auto",
            "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": po.PROMPT}],
        },
    ),
}


def spec(
    url: str, headers: dict[str, str], body: dict[str, Any], stream: bool, **extra: Any
) -> dict[str, Any]:
    full = {**body, "stream": True} if stream else body
    return {"url": url, "headers": headers, "body": full, "stream": stream, **extra}


def served(
    base: str, wanted: dict[str, tuple[str, dict[str, str], dict[str, Any]]]
) -> dict[str, tuple[str, dict[str, str], dict[str, Any]]]:
    """The endpoints this proxy answers, each warmed once (litellm's import, the first time)."""
    out = {}
    for name, (path, headers, body) in wanted.items():
        for stream in (False, True):
            r = httpx.post(
                base + path, json={**body, "stream": stream}, headers=headers, timeout=120
            )
            if r.status_code != 200:
                print(f"{name}: {path} answered {r.status_code}, left out: {r.text[:200]}")
                break
        else:
            out[name] = (base + path, headers, body)
    return out


def closed_round(
    endpoints: dict[str, tuple[str, dict[str, str], dict[str, Any]]],
    pid: int,
    stream: bool,
    seconds: float,
) -> dict[str, tuple[float, float]]:
    figures = {}
    for name, (url, headers, body) in endpoints.items():
        s = spec(url, headers, body, stream, mode="closed", concurrency=64, duration=seconds)
        s["warmup"] = 1.0
        cpu0 = po.group_cpu_s(pid)
        res = po.run_loadgen(s)
        cpu_ms = (po.group_cpu_s(pid) - cpu0) / max(res["completed"], 1) * 1000
        figures[name] = (res["rps"], cpu_ms)
    return figures


def open_round(
    endpoints: dict[str, tuple[str, dict[str, str], dict[str, Any]]],
    direct: str,
    stream: bool,
    rate: float,
    seconds: float,
) -> dict[str, tuple[float, float]]:
    targets = {"direct": (direct, JSON, {**ENDPOINTS["chat"][2], "model": "echo"}), **endpoints}
    figures = {}
    for name, (url, headers, body) in targets.items():
        s = spec(url, headers, body, stream, mode="open", rate=rate, duration=seconds, warmup=2.0)
        res = po.run_loadgen(s)
        key = "ttfb_ms" if stream else "total_ms"
        figures[name] = (po.pct(res[key], 50), po.pct(res[key], 99))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per point")
    ap.add_argument(
        "--passthrough",
        action="store_true",
        help="also /v1/responses to a tier that speaks Responses (`apis: [chat, responses]`: "
        "the request passed through, its stream metered by responses_relay)",
    )
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="agent-apis-"))
    echo_port, port = po.free_port(), po.free_port()
    echo_url = f"http://127.0.0.1:{echo_port}/v1"
    router_yaml, _, _ = po.write_configs(tmp, echo_url, port)
    endpoints_wanted = dict(ENDPOINTS)
    if a.passthrough:
        config = yaml.safe_load(router_yaml.read_text())
        native = {**config["tiers"][0], "name": "native", "apis": ["chat", "responses"]}
        config["tiers"].append(native)
        router_yaml.write_text(yaml.safe_dump(config))
        path, headers, body = ENDPOINTS["responses"]
        endpoints_wanted["responses (passthrough)"] = (path, headers, {**body, "model": "native"})
    added: dict[tuple[str, bool], list[float]] = {}
    cpu: dict[tuple[str, bool], list[float]] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            po.process(
                [po.PY, "-m", "benchmarks.echo_upstream", "--port", str(echo_port)],
                f"{echo_url}/models",
                tmp / "echo.log",
            )
        )
        proc = stack.enter_context(
            po.process(
                [po.PY, "-m", "router.cli", "serve", "--config", str(router_yaml)],
                f"http://127.0.0.1:{port}/healthz",
                tmp / "router.log",
            )
        )
        endpoints = served(f"http://127.0.0.1:{port}", endpoints_wanted)
        for r in range(a.rounds):
            for stream in (False, True):
                mode = "stream" if stream else "non-stream"
                closed = closed_round(endpoints, proc.pid, stream, a.seconds)
                print(
                    f"round {r} {mode:10s} closed: "
                    + " | ".join(
                        f"{n} {rps:.0f} req/s {c:.3f} ms CPU/req" for n, (rps, c) in closed.items()
                    ),
                    flush=True,
                )
                opened = open_round(
                    endpoints, f"{echo_url}/chat/completions", stream, a.rate, a.seconds
                )
                d50, d99 = opened.pop("direct")
                print(
                    f"round {r} {mode:10s} open {a.rate:.0f}/s: "
                    + " | ".join(
                        f"{n} added p50 +{p50 - d50:.2f} p99 +{p99 - d99:.2f} ms"
                        for n, (p50, p99) in opened.items()
                    )
                    + f" (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
                for n, (p50, _) in opened.items():
                    added.setdefault((n, stream), []).append(p50 - d50)
                    cpu.setdefault((n, stream), []).append(closed[n][1])
    print("\n| mode | endpoint | added p50 ms (median) | vs chat | CPU ms/request | vs chat |")
    print("|---|---|---|---|---|---|")
    for stream in (False, True):
        chat_p50 = statistics.median(added[("chat", stream)])
        chat_cpu = statistics.median(cpu[("chat", stream)])
        for n in endpoints:
            p50, c = statistics.median(added[(n, stream)]), statistics.median(cpu[(n, stream)])
            mode = "stream" if stream else "non-stream"
            vs_p50, vs_cpu = p50 - chat_p50, c - chat_cpu
            print(f"| {mode} | {n} | {p50:.2f} | {vs_p50:+.2f} | {c:.3f} | {vs_cpu:+.3f} |")


if __name__ == "__main__":
    main()
