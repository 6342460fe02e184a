"""Latency the proxy adds over calling its upstream directly, side by side with LiteLLM's proxy.

Starts, on free ports: our echo upstream (benchmarks/echo_upstream.py), cost-router in front of it
(`cost-router serve --config`, two tiers on the echo server, requests use `model: auto` so the
classifier, policy, budget reserve/settle and trace writing are all on the path), and LiteLLM's
proxy (`litellm --config`, access log off like ours) in front of the same echo server.

A separate load-generator process (aiohttp) first measures each target's sustained throughput
(closed loop, many concurrent clients; plus the server's CPU time per request), then its latency
in an open loop (requests start on a fixed schedule whether or not earlier ones finished) at each
rate, non-streaming and streaming. Open-loop points above 80% of a target's measured capacity are
reported as saturated instead of run: they would only measure a growing queue.

    .venv/bin/python benchmarks/proxy_overhead.py            # ~5 minutes
    .venv/bin/python benchmarks/proxy_overhead.py --quick    # ~1 minute smoke run

"Added" = percentile through the proxy minus the same percentile calling the upstream directly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
MASTER_KEY = "sk-bench-0123456789abcdef"
SATURATION = 0.8  # open-loop points above this fraction of a target's max throughput are skipped
PROMPT = "Summarise the main causes of the French revolution in three sentences."

# --- load generator (runs in its own process) ----------------------------------------------------


async def _one(
    session: Any, url: str, payload: bytes, headers: dict[str, str], stream: bool, scheduled: float
) -> tuple[float, float, float, int]:
    first = None
    async with session.post(url, data=payload, headers=headers) as resp:
        if stream:
            async for _ in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter()
        else:
            await resp.read()
        status = resp.status
    end = time.perf_counter()
    return scheduled, (first or end) - scheduled, end - scheduled, status


def _payloads(spec: dict[str, Any]) -> list[bytes]:
    """The request bodies, sent in turn: one, or with spec["prompts"] = N, N that differ in the
    prompt (the classifier's score cache then misses, as for traffic that never repeats)."""
    body = spec["body"]
    if spec.get("prompts", 1) <= 1:
        return [json.dumps(body).encode()]
    out = []
    for i in range(spec["prompts"]):
        messages = [{"role": "user", "content": f"{PROMPT} (variant {i})"}]
        out.append(json.dumps({**body, "messages": messages}).encode())
    return out


async def _open_loop(spec: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    rate, duration, warmup = spec["rate"], spec["duration"], spec["warmup"]
    payloads = _payloads(spec)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter() + 0.05
        tasks = []
        for i in range(int(rate * (warmup + duration))):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(
                asyncio.ensure_future(
                    _one(
                        session,
                        spec["url"],
                        payloads[i % len(payloads)],
                        spec["headers"],
                        spec["stream"],
                        scheduled,
                    )
                )
            )
        results = await asyncio.gather(*tasks, return_exceptions=True)
    kept = [r for r in results if not isinstance(r, BaseException) and r[0] >= start + warmup]
    errors = sum(1 for r in results if isinstance(r, BaseException) or r[3] != 200)
    return {
        "ttfb_ms": [r[1] * 1000 for r in kept if r[3] == 200],
        "total_ms": [r[2] * 1000 for r in kept if r[3] == 200],
        "errors": errors,
        "sent": len(results),
    }


async def _closed_loop(spec: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    payloads = _payloads(spec)
    sent = 0
    stop_at = time.perf_counter() + spec["warmup"] + spec["duration"]
    measure_from = time.perf_counter() + spec["warmup"]
    done = errors = completed = 0

    async def worker(session: Any) -> None:
        nonlocal done, errors, completed, sent
        while (now := time.perf_counter()) < stop_at:
            payload = payloads[sent % len(payloads)]
            sent += 1
            try:
                _, _, _, status = await _one(
                    session, spec["url"], payload, spec["headers"], spec["stream"], now
                )
            except Exception:  # noqa: BLE001 - counted, the load goes on
                status = 0
            completed += status == 200
            if time.perf_counter() >= measure_from:
                done += status == 200
                errors += status != 200

    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(spec["concurrency"])))
    return {"rps": done / spec["duration"], "errors": errors, "completed": completed}


def loadgen_main(spec_json: str) -> None:
    import uvloop

    spec = json.loads(spec_json)
    run = _closed_loop if spec["mode"] == "closed" else _open_loop
    print(json.dumps(uvloop.run(run(spec))))


def run_loadgen(spec: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [PY, __file__, "--loadgen", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- targets -------------------------------------------------------------------------------------


@contextlib.contextmanager
def process(
    argv: list[str],
    ready_url: str,
    log: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 120,
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[:3]} exited early; see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[:3]} not ready; see {log}")
            time.sleep(0.3)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group (a target server)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_configs(tmp: Path, echo_url: str, router_port: int) -> tuple[Path, Path, Path]:
    price = {"input_per_mtok": 1.0, "output_per_mtok": 1.0}
    router_cfg = {
        "server": {"port": router_port},
        "tiers": [
            {
                "name": "small",
                "base_url": echo_url,
                "model": "echo",
                "price": price,
                "max_inflight": 1024,
            },
            {
                "name": "large",
                "base_url": echo_url,
                "model": "echo",
                "price": {"input_per_mtok": 10.0, "output_per_mtok": 30.0},
                "max_inflight": 1024,
            },
        ],
        "traces": {"path": str(tmp / "traces" / "requests.jsonl")},
        "signals": {"enabled": False},
    }
    litellm_cfg = {
        "model_list": [
            {
                "model_name": "echo",
                "litellm_params": {
                    "model": "openai/echo",
                    "api_base": echo_url,
                    "api_key": "sk-unused",
                },
            }
        ],
    }
    # Both proxies run without per-request access logging.
    log_cfg = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"err": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn.access": {"level": "WARNING", "handlers": ["err"]},
            "uvicorn": {"level": "WARNING", "handlers": ["err"]},
        },
    }
    paths = (tmp / "router.yaml", tmp / "litellm.yaml", tmp / "logging.json")
    paths[0].write_text(yaml.safe_dump(router_cfg))
    paths[1].write_text(yaml.safe_dump(litellm_cfg))
    paths[2].write_text(json.dumps(log_cfg))
    return paths


# --- the run ------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loadgen", help=argparse.SUPPRESS)
    ap.add_argument("--rates", default="50,200")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds measured per point")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--throughput-seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--skip-litellm", action="store_true")
    ap.add_argument(
        "--model", type=Path, default=None, help="classifier .onnx (default: the shipped one)"
    )
    ap.add_argument(
        "--prompts",
        type=int,
        default=1,
        help="distinct prompts sent in turn (default 1, the same prompt every time; more than "
        "the classifier's score cache holds, 2,048, makes every `auto` request a cache miss)",
    )
    ap.add_argument(
        "--tier-named",
        action="store_true",
        help="also measure the same cost-router naming a tier (`model: small`: no classifier, no "
        "policy), beside `auto`, for the share of the proxy's cost that routing takes",
    )
    ap.add_argument("--quick", action="store_true", help="short points (smoke run)")
    ap.add_argument(
        "--trace",
        action="store_true",
        help="cost-router with OpenTelemetry tracing on (every request sampled, "
        "OTLP/HTTP to a local do-nothing collector, benchmarks/otlp_sink.py)",
    )
    a = ap.parse_args()
    if a.loadgen:
        loadgen_main(a.loadgen)
        return
    if a.quick:
        a.duration, a.warmup, a.throughput_seconds = 3.0, 1.0, 3.0
    rates = [float(r) for r in a.rates.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="proxy-overhead-"))
    echo_port, router_port, litellm_port = free_port(), free_port(), free_port()
    echo_url = f"http://127.0.0.1:{echo_port}/v1"
    router_yaml, litellm_yaml, log_json = write_configs(tmp, echo_url, router_port)
    if a.model is not None:
        config = yaml.safe_load(router_yaml.read_text())
        config["classifier"] = {"model_path": str(a.model.resolve())}
        router_yaml.write_text(yaml.safe_dump(config))
    print(f"load average before: {os.getloadavg()}; logs in {tmp}", flush=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            process(
                [PY, "-m", "benchmarks.echo_upstream", "--port", str(echo_port)],
                f"{echo_url}/models",
                tmp / "echo.log",
            )
        )
        if a.trace:
            sink_port = free_port()
            stack.enter_context(
                process(
                    [PY, "-m", "benchmarks.otlp_sink", "--port", str(sink_port)],
                    f"http://127.0.0.1:{sink_port}/healthz",
                    tmp / "otlp.log",
                )
            )
            config = yaml.safe_load(router_yaml.read_text())
            config["telemetry"] = {
                "enabled": True,
                "sample_ratio": 1.0,
                "endpoint": f"http://127.0.0.1:{sink_port}/v1/traces",
            }
            router_yaml.write_text(yaml.safe_dump(config))
        router = stack.enter_context(
            process(
                [PY, "-m", "router.cli", "serve", "--config", str(router_yaml)],
                f"http://127.0.0.1:{router_port}/healthz",
                tmp / "router.log",
            )
        )
        targets = {
            "direct": (f"{echo_url}/chat/completions", {}, "echo"),
            "cost-router": (f"http://127.0.0.1:{router_port}/v1/chat/completions", {}, "auto"),
        }
        pgids = {"cost-router": router.pid}
        if a.tier_named:  # same server process: only the request's `model` differs
            targets["cost-router (tier)"] = (targets["cost-router"][0], {}, "small")
            pgids["cost-router (tier)"] = router.pid
        if not a.skip_litellm:
            litellm = str(Path(PY).parent / "litellm")
            lite = stack.enter_context(
                process(
                    [
                        litellm,
                        "--config",
                        str(litellm_yaml),
                        "--port",
                        str(litellm_port),
                        "--num_workers",
                        "1",
                        "--log_config",
                        str(log_json),
                    ],
                    f"http://127.0.0.1:{litellm_port}/health/liveliness",
                    tmp / "litellm.log",
                    env={
                        "LITELLM_MASTER_KEY": MASTER_KEY,
                        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                        "LITELLM_LOG": "ERROR",
                    },
                )
            )
            targets["litellm"] = (
                f"http://127.0.0.1:{litellm_port}/v1/chat/completions",
                {"Authorization": f"Bearer {MASTER_KEY}"},
                "echo",
            )
            pgids["litellm"] = lite.pid
        # Throughput first: an open-loop point above a target's capacity leaves it a backlog
        # of abandoned requests that would depress whatever is measured after it.
        throughput = throughput_points(a, targets, pgids)
        capacity = {(t["target"], t["stream"]): t["rps"] for t in throughput}
        rows = latency_points(a, rates, targets, capacity)
    print(f"load average after: {os.getloadavg()}")
    print_tables(rows, throughput)


Targets = dict[str, tuple[str, dict[str, str], str]]  # name -> (url, headers, model)


def _spec(
    url: str, headers: dict[str, str], model: str, stream: bool, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    if stream:
        body["stream"] = True
    headers = {"content-type": "application/json", **headers}
    return {"url": url, "headers": headers, "body": body, "stream": stream, **extra}


def latency_points(
    a: argparse.Namespace,
    rates: list[float],
    targets: Targets,
    capacity: dict[tuple[str, bool], float],
) -> list[dict[str, Any]]:
    rows = []
    for stream in (False, True):
        for rate in rates:
            for name, (url, headers, model) in targets.items():
                if rate > SATURATION * capacity[(name, stream)]:
                    # Open-loop load above capacity only measures a growing queue.
                    rows.append(
                        {
                            "stream": stream,
                            "rate": rate,
                            "target": name,
                            "saturated": capacity[(name, stream)],
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
                    continue
                spec = _spec(
                    url,
                    headers,
                    model,
                    stream,
                    mode="open",
                    prompts=a.prompts,
                    rate=rate,
                    duration=a.duration,
                    warmup=a.warmup,
                )
                res = run_loadgen(spec)
                key = "ttfb_ms" if stream else "total_ms"
                total = res["total_ms"]
                row = {
                    "stream": stream,
                    "rate": rate,
                    "target": name,
                    "n": len(res[key]),
                    "errors": res["errors"],
                    "p50": pct(res[key], 50),
                    "p99": pct(res[key], 99),
                    "p50_total": pct(total, 50),
                    "p99_total": pct(total, 99),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def throughput_points(
    a: argparse.Namespace, targets: Targets, pgids: dict[str, int]
) -> list[dict[str, Any]]:
    out = []
    for stream in (False, True):
        for name, (url, headers, model) in targets.items():
            spec = _spec(
                url,
                headers,
                model,
                stream,
                mode="closed",
                prompts=a.prompts,
                concurrency=a.concurrency,
                duration=a.throughput_seconds,
                warmup=a.warmup,
            )
            cpu0 = group_cpu_s(pgids[name]) if name in pgids else 0.0
            res = run_loadgen(spec)
            served = res.pop("completed")
            cpu = group_cpu_s(pgids[name]) - cpu0 if name in pgids else 0.0
            row = {
                "stream": stream,
                "target": name,
                **res,
                "cpu_ms_per_req": cpu * 1000 / served if served and name in pgids else None,
            }
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


def print_tables(rows: list[dict[str, Any]], throughput: list[dict[str, Any]]) -> None:
    base = {(r["stream"], r["rate"]): r for r in rows if r["target"] == "direct"}
    print(
        "\n| mode | rate (req/s) | target | n | p50 ms | p99 ms | added p50 ms | added p99 ms "
        "| p50 / p99 full stream ms | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        d = base[(r["stream"], r["rate"])]
        mode = "stream (TTFB)" if r["stream"] else "non-stream"
        if "saturated" in r:
            print(
                f"| {mode} | {r['rate']:.0f} | {r['target']} | - | saturated: sustains only "
                f"{r['saturated']:.0f} req/s | | | | | |"
            )
            continue
        added = (
            ("-", "-")
            if r["target"] == "direct"
            else (f"{r['p50'] - d['p50']:+.2f}", f"{r['p99'] - d['p99']:+.2f}")
        )
        full = f"{r['p50_total']:.2f} / {r['p99_total']:.2f}" if r["stream"] else "-"
        print(
            f"| {mode} | {r['rate']:.0f} | {r['target']} | {r['n']} | {r['p50']:.2f} | "
            f"{r['p99']:.2f} | {added[0]} | {added[1]} | {full} | {r['errors']} |"
        )
    print("\n| mode | target | sustained req/s | vs LiteLLM | server CPU ms / request | errors |")
    print("|---|---|---|---|---|---|")
    lite = {t["stream"]: t["rps"] for t in throughput if t["target"] == "litellm"}
    named = {t["stream"]: t["rps"] for t in throughput if t["target"] == "cost-router (tier)"}
    for t in throughput:
        ratio = f"{t['rps'] / lite[t['stream']]:.2f}x" if lite.get(t["stream"]) else "-"
        mode = "stream" if t["stream"] else "non-stream"
        cpu = f"{t['cpu_ms_per_req']:.2f}" if t["cpu_ms_per_req"] is not None else "-"
        print(f"| {mode} | {t['target']} | {t['rps']:.0f} | {ratio} | {cpu} | {t['errors']} |")
    for stream, rps in named.items():
        auto = next(
            t["rps"] for t in throughput if t["target"] == "cost-router" and t["stream"] == stream
        )
        mode = "stream" if stream else "non-stream"
        print(f"{mode}: `auto` sustains {auto / rps:.0%} of the tier-named throughput")


if __name__ == "__main__":
    main()
