"""Two revisions of the proxy side by side: this tree vs a base checkout, same echo upstream.

For a change to the request path, the machine-independent question is "did it get cheaper?":
both proxies run at once and are measured alternately, so machine load hits both alike. Closed
loop (64 clients): sustained req/s and server CPU ms per request; open loop at --rate: added p50
and p99 over calling the upstream directly (TTFB when streaming).

    git worktree add /tmp/base 38c5072 && cp -r classifiers /tmp/base/   # same classifier in both
    .venv/bin/python benchmarks/proxy_ab.py --base /tmp/base [--rounds 3] [--rate 200]

Tracing on vs off, one tree: `--base . --trace this` runs this tree's proxy with
`telemetry.enabled` (every request sampled, spans exported over OTLP/HTTP to a local do-nothing
collector, benchmarks/otlp_sink.py) next to the same code with tracing off.

Shadow sampling on vs off, one tree: `--base . --shadow 0.1` runs this tree's proxy with
`evaluation.enabled` at sample rate 0.1 (each sampled request is sent again to the other tier,
the same echo upstream, after the answer; records written, the `reference` judge) next to the same
code with shadow comparisons off. The upstream serves both proxies' traffic, so the shadow
calls load it for both alike, as they would a real one.

Session modes, one tree: `--base . --session sticky [--redis redis://127.0.0.1:6379/0]` runs
both proxies with one threshold policy and their budgets (and so session state) in Redis; this
tree's policy has `session: {mode: sticky}` (the session step rides on the budget reserve's
script: no round trip of its own), the base's the default per_request (no session step). The
load generator sends one prompt, so every request is a turn of one derived session.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import proxy_overhead as po  # noqa: E402
import yaml  # noqa: E402


def start(
    stack: contextlib.ExitStack,
    tree: Path,
    echo_url: str,
    tmp: Path,
    sections: dict[str, dict[str, object]] | None = None,
) -> tuple[str, int]:
    """A proxy serving `tree`'s code (run from its directory, so its packages are the ones
    imported) in front of the echo upstream; `sections`: config sections set on top."""
    port = po.free_port()
    tmp.mkdir()
    router_yaml, _, _ = po.write_configs(tmp, echo_url, port)
    if sections:
        config = yaml.safe_load(router_yaml.read_text())
        router_yaml.write_text(yaml.safe_dump({**config, **sections}))
    po.ROOT = tree
    proc = stack.enter_context(
        po.process(
            [po.PY, "-m", "router.cli", "serve", "--config", str(router_yaml)],
            f"http://127.0.0.1:{port}/healthz",
            tmp / "router.log",
        )
    )
    return f"http://127.0.0.1:{port}/v1/chat/completions", proc.pid


def closed_round(targets: dict[str, tuple[str, int]], stream: bool, seconds: float) -> str:
    out = []
    for name, (url, pid) in targets.items():
        spec = po._spec(
            url, {}, "auto", stream, mode="closed", concurrency=64, duration=seconds, warmup=1.0
        )
        cpu0 = po.group_cpu_s(pid)
        res = po.run_loadgen(spec)
        cpu_ms = (po.group_cpu_s(pid) - cpu0) / max(res["completed"], 1) * 1000
        out.append(f"{name} {res['rps']:.0f} req/s {cpu_ms:.3f} ms CPU/req")
    return " | ".join(out)


def open_round(targets: dict[str, str], stream: bool, rate: float, seconds: float) -> str:
    figures = {}
    for name, url in targets.items():
        model = "echo" if name == "direct" else "auto"
        spec = po._spec(
            url, {}, model, stream, mode="open", rate=rate, duration=seconds, warmup=2.0
        )
        res = po.run_loadgen(spec)
        key = "ttfb_ms" if stream else "total_ms"
        figures[name] = (po.pct(res[key], 50), po.pct(res[key], 99))
    d50, d99 = figures.pop("direct")
    return " | ".join(
        f"{n} added p50 +{p50 - d50:.2f} p99 +{p99 - d99:.2f} ms"
        for n, (p50, p99) in figures.items()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="checkout of the base revision")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per point")
    ap.add_argument(
        "--trace",
        choices=["none", "this", "both"],
        default="none",
        help="proxies run with OpenTelemetry tracing on (sample ratio 1, OTLP/HTTP "
        "to a local sink); `--base . --trace this`: tracing off vs on",
    )
    ap.add_argument(
        "--shadow",
        type=float,
        default=None,
        metavar="RATE",
        help="this tree's proxy samples RATE of requests for shadow comparisons "
        "(`--base . --shadow 0.1`: shadow sampling off vs 10%%)",
    )
    ap.add_argument(
        "--session",
        choices=["per_request", "sticky", "escalate_only", "cache_aware"],
        default=None,
        help="this tree's policy runs in this session mode (`--base . --session sticky`)",
    )
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="with --session")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="proxy-ab-"))
    echo_port = po.free_port()
    echo_url = f"http://127.0.0.1:{echo_port}/v1"
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            po.process(
                [po.PY, "-m", "benchmarks.echo_upstream", "--port", str(echo_port)],
                f"{echo_url}/models",
                tmp / "echo.log",
            )
        )
        trees = {"base": a.base.resolve(), "this": po.ROOT}
        extra: dict[str, dict[str, dict[str, object]]] = {n: {} for n in trees}
        if a.trace != "none":
            sink_port = po.free_port()
            stack.enter_context(
                po.process(
                    [po.PY, "-m", "benchmarks.otlp_sink", "--port", str(sink_port)],
                    f"http://127.0.0.1:{sink_port}/healthz",
                    tmp / "otlp.log",
                )
            )
            section = {
                "enabled": True,
                "sample_ratio": 1.0,
                "endpoint": f"http://127.0.0.1:{sink_port}/v1/traces",
            }
            for n in ["this"] if a.trace == "this" else trees:
                extra[n]["telemetry"] = section
        if a.shadow is not None:
            extra["this"]["evaluation"] = {
                "enabled": True,
                "sample_rate": a.shadow,
                "queue_size": 1024,
                "workers": 4,
                "daily_cap_usd": 1e6,
            }
        if a.session is not None:
            for n in trees:
                prefix = f"proxy-ab-{os.getpid()}-{n}"
                extra[n]["budgets"] = {"store": "redis", "redis_url": a.redis, "key_prefix": prefix}
                extra[n]["default_policy"] = "ab"  # type: ignore[assignment]
                extra[n]["policies"] = {"ab": {"type": "threshold"}}
            extra["this"]["policies"] = {
                "ab": {"type": "threshold", "session": {"mode": a.session}}
            }
        targets = {n: start(stack, t, echo_url, tmp / n, extra[n]) for n, t in trees.items()}
        urls = {"direct": f"{echo_url}/chat/completions", **{n: u for n, (u, _) in targets.items()}}
        for r in range(a.rounds):
            for stream in (False, True):
                mode = "stream" if stream else "non-stream"
                print(f"round {r} {mode:10s} closed: {closed_round(targets, stream, a.seconds)}")
                print(
                    f"round {r} {mode:10s} open {a.rate:.0f}/s: "
                    f"{open_round(urls, stream, a.rate, a.seconds)} "
                    f"(load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
        if a.shadow is not None:  # the comparisons really ran
            metrics = httpx.get(
                targets["this"][0].replace("/v1/chat/completions", "/metrics"), timeout=5
            ).text
            print(
                "shadow: "
                + ", ".join(
                    line
                    for line in metrics.splitlines()
                    if line.startswith("cost_router_shadow_") and "_total" in line
                )
            )
        if a.trace != "none":  # the spans really left: batches the collector received
            stats = httpx.get(f"http://127.0.0.1:{sink_port}/stats", timeout=5).json()
            print(f"OTLP sink: {stats['exports']} exports, {stats['bytes']} bytes")


if __name__ == "__main__":
    main()
