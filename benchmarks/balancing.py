"""Balancing inside a tier: three deployments of unequal speed behind the proxy.

Starts three echo upstreams (benchmarks/echo_upstream.py, `--delay-ms` each; by default two fast,
one slow) and the proxy (uvicorn, in a thread of this process, as the tests run it) with one tier
listing them as `deployments`. For each strategy (least_outstanding, weighted, round_robin) it
sends N requests at concurrency C (after a short warm-up) and reports each deployment's share
and the p50/p95 latency.
Then the kill test (least_outstanding, probes every `--probe-ms`): under the same load, the slow
deployment's process is stopped part-way; it reports the time and the requests between the kill
and the proxy ejecting it, and the errors clients saw (the expected figure is 0).

    .venv/bin/python benchmarks/balancing.py                                   # ~1 minute
    .venv/bin/python benchmarks/balancing.py --requests 60 --concurrency 4     # smoke run

Requests are non-streaming chat completions for an explicit tier (`model: large`), so no
classifier or budget work is measured, only the balancing. The load generator (aiohttp) shares
this process with the proxy: absolute latencies are higher than with separate processes; the
comparison between strategies is what this measures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/support from a checkout

from benchmarks.echo_upstream import running_echo_upstream  # noqa: E402
from tests.support.proxy import ProxyThread, make_config  # noqa: E402

STRATEGIES = ("least_outstanding", "weighted", "round_robin")
BODY = json.dumps(
    {"model": "large", "max_tokens": 8, "messages": [{"role": "user", "content": "hello there"}]}
).encode()


@dataclass
class Run:
    latencies_ms: list[float] = field(default_factory=list)
    shares: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    done_at: list[float] = field(default_factory=list)  # monotonic end of each request

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        total = sum(self.shares.values()) or 1
        return {
            "requests": len(lat) + self.errors,
            "errors": self.errors,
            "share": {k: round(v / total, 3) for k, v in sorted(self.shares.items())},
            "p50_ms": round(statistics.median(lat), 1) if lat else None,
            "p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 1) if lat else None,
        }


async def load(
    url: str, requests: int, concurrency: int, run: Run, started: asyncio.Event | None = None
) -> None:
    """`requests` requests from `concurrency` clients in a closed loop."""
    left = iter(range(requests))
    headers = {"content-type": "application/json"}
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def client() -> None:
            for _ in left:
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=BODY, headers=headers) as resp:
                        await resp.read()
                        ok, who = resp.status == 200, resp.headers.get("x-router-deployment")
                except aiohttp.ClientError:
                    ok, who = False, None
                if ok and who:
                    run.latencies_ms.append((time.perf_counter() - t0) * 1000)
                    run.shares[who] += 1
                else:
                    run.errors += 1
                run.done_at.append(time.monotonic())
                if started is not None and not started.is_set():
                    started.set()

        await asyncio.gather(*(client() for _ in range(concurrency)))


def config_for(
    urls: list[str], strategy: str, weights: list[float], probe_s: float, trace_dir: Path
) -> Any:
    deployments = [
        {"name": f"d{i}", "base_url": u, "weight": w}
        for i, (u, w) in enumerate(zip(urls, weights, strict=True))
    ]
    tier = {
        "name": "large",
        "model": "echo",
        "deployments": deployments,
        "timeout_s": 30,
        "price": {"input_per_mtok": 1, "output_per_mtok": 1},
        "balancing": {"strategy": strategy, "probe_interval_s": probe_s},
    }
    return make_config([tier], trace_dir, traces={"path": None})


def strategies(urls: list[str], a: argparse.Namespace, weights: list[float]) -> dict[str, Any]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in STRATEGIES:
            w = weights if strategy == "weighted" else [1.0] * len(urls)
            with ProxyThread(config_for(urls, strategy, w, a.probe_ms / 1000, Path(tmp))) as p:
                url = f"{p.url}/v1/chat/completions"
                asyncio.run(load(url, 2 * a.concurrency, a.concurrency, Run()))  # warm-up
                run = Run()
                t0 = time.perf_counter()
                asyncio.run(load(url, a.requests, a.concurrency, run))
                rate = a.requests / (time.perf_counter() - t0)
            out[strategy] = {**run.summary(), "req_per_s": round(rate, 1), "weights": w}
    return out


def kill_test(delays: list[str], a: argparse.Namespace) -> dict[str, Any]:
    """Stop the last deployment part-way through a run; time its ejection as the proxy sees it."""
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        urls = [stack.enter_context(running_echo_upstream("--delay-ms", d)) for d in delays[:-1]]
        victim = contextlib.ExitStack()
        urls.append(victim.enter_context(running_echo_upstream("--delay-ms", delays[-1])))
        config = config_for(
            urls, "least_outstanding", [1.0] * len(urls), a.probe_ms / 1000, Path(tmp)
        )
        with ProxyThread(config) as proxy:
            status = proxy.state.backends["large"].deployments.status  # type: ignore[attr-defined]
            run = Run()
            result: dict[str, Any] = {}

            def killer() -> None:
                while len(run.done_at) < a.requests // 4:
                    time.sleep(0.001)
                killed = time.monotonic()
                victim.close()  # SIGTERM, then waits until the process is gone
                deadline = killed + 30
                while status()[f"d{len(urls) - 1}"]["available"] and time.monotonic() < deadline:
                    time.sleep(0.001)
                ejected = time.monotonic()
                result["ms_to_ejection"] = round((ejected - killed) * 1000, 1)
                result["requests_to_ejection"] = sum(killed <= t <= ejected for t in run.done_at)

            thread = threading.Thread(target=killer, daemon=True)
            thread.start()
            asyncio.run(load(f"{proxy.url}/v1/chat/completions", a.requests, a.concurrency, run))
            thread.join(timeout=30)
        victim.close()
    return {**run.summary(), **result, "probe_interval_ms": a.probe_ms}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="per strategy")
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--delays-ms", default="5,5,40", help="each deployment's --delay-ms")
    parser.add_argument("--weights", default="2,2,1", help="for the weighted run")
    parser.add_argument("--probe-ms", type=float, default=500, help="balancing.probe_interval_s")
    parser.add_argument("--json", type=Path, help="also write the results here")
    a = parser.parse_args(argv)
    delays = a.delays_ms.split(",")
    weights = [float(w) for w in a.weights.split(",")]
    if len(weights) != len(delays):
        parser.error("--weights needs one weight per deployment of --delays-ms")
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(running_echo_upstream("--delay-ms", d)) for d in delays]
        results: dict[str, Any] = {
            "delays_ms": [float(d) for d in delays],
            "concurrency": a.concurrency,
            "strategies": strategies(urls, a, weights),
        }
    results["kill"] = kill_test(delays, a)
    print(
        f"deployments d0..d{len(delays) - 1}, --delay-ms {a.delays_ms}; {a.requests} requests "
        f"at concurrency {a.concurrency}"
    )
    # Clients, router and upstreams share this process's CPU: in a closed loop the latencies
    # trade against throughput, so both are printed.
    print(
        f"{'strategy':<18} {'share per deployment':<36} {'req/s':>7} {'p50 ms':>7} "
        f"{'p95 ms':>7} errors"
    )
    for name, r in results["strategies"].items():
        share = " ".join(f"{k}={v:.3f}" for k, v in r["share"].items())
        print(
            f"{name:<18} {share:<36} {r['req_per_s']:>7} {r['p50_ms']:>7} {r['p95_ms']:>7} "
            f"{r['errors']:>6}"
        )
    k = results["kill"]
    print(
        f"kill d{len(delays) - 1} after {a.requests // 4} requests (probes every "
        f"{a.probe_ms:.0f} ms): ejected after {k.get('ms_to_ejection')} ms and "
        f"{k.get('requests_to_ejection')} requests; {k['errors']} errors of {k['requests']}; "
        f"share over the run {k['share']}"
    )
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
