"""What a misbehaving upstream costs a team, and what a huge stream costs the proxy (issue 12).

Runs the proxy of a checkout (this one, or an old one for a before/after) as its own process in
front of the fault-injecting upstream, with budgets on Redis, and reports: the charge and the
team's spend for usage of 10**8 tokens and for negative usage, the charge of a stream of
``--mb`` MB without usage against what was reserved, the slowest /healthz answer during that
stream, and the proxy's peak RSS (VmHWM) after a stream of ``--rss-mb`` MB (0 skips it).

    python -m benchmarks.usage_safety --checkout ../old-checkout --mb 60 --rss-mb 200
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from benchmarks.fault_upstream import running_fault_upstream
from policies.keys import hash_key
from tests.support.ports import free_port

HERE = Path(__file__).resolve().parents[1]
TEAMS = ("huge", "negative", "no_usage", "unbounded", "rss")


def _key(team: str) -> str:
    return f"sk-usage-safety-{team}"


def _auth(team: str) -> dict[str, str]:
    return {"authorization": f"Bearer {_key(team)}"}


def _config(path: Path, upstream: str, redis_url: str, prefix: str) -> None:
    cfg = {
        "tiers": [
            {
                "name": "small",
                "base_url": upstream,
                "model": "echo-small",
                "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
                "timeout_s": 600,
            }
        ],
        # One team per scenario, each with a $5 limit: a scenario that overspends its team
        # must not turn the next one into a 429.
        "teams": {t: {"budget": {"limit_usd": 5.0, "period": "total"}} for t in TEAMS},
        "keys": [{"key_sha256": hash_key(_key(t)), "team": t} for t in TEAMS],
        # Not enforced, so a request without max_tokens streams with no completion bound: the
        # router then counts the whole stream (the "unbounded" scenarios).
        "budgets": {
            "store": "redis",
            "redis_url": redis_url,
            "key_prefix": prefix,
            "enforce_max_tokens": False,
        },
        "signals": {"enabled": False},
        "traces": {"path": None},
    }
    path.write_text(yaml.safe_dump(cfg))


def _ask(fault: str, bounded: bool = True, **meta: str) -> dict[str, Any]:
    body = {
        "model": "small",
        "messages": [{"role": "user", "content": f"about {fault}"}],
        "metadata": {"fault": fault, **meta},
    }
    return {**body, "max_tokens": 50} if bounded else body


def _hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Proxy:
    def __init__(self, checkout: Path, config: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            sys.executable,
            "-m",
            "router.cli",
            "serve",
            "-c",
            str(config),
            "--port",
            str(self.port),
        ]
        self.proc = subprocess.Popen(
            argv, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("proxy did not start")
            time.sleep(0.2)

    def budget(self, team: str) -> dict[str, Any]:
        scope = httpx.get(self.url + "/v1/budget", headers=_auth(team), timeout=300).json()[
            "scopes"
        ][0]
        return {
            "spent_usd": scope["spent_usd"],
            "reserved_usd": scope["reserved_usd"],
            "limit_usd": scope["limit_usd"],
        }

    def settled(self, team: str) -> dict[str, Any]:
        """The team's budget once nothing is reserved (every settle has landed)."""
        deadline = time.monotonic() + 30
        while (b := self.budget(team))["reserved_usd"] > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        return b

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def _post(proxy: Proxy, team: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=_auth(team), timeout=120)
    return {"status": r.status_code, "charged_usd": r.headers.get("x-router-cost-usd")}


def _stream(proxy: Proxy, team: str, body: dict[str, Any]) -> dict[str, Any]:
    full = {**body, "stream": True, "stream_options": {"include_usage": True}}
    last: list[bytes] = []
    size = 0
    with httpx.stream(
        "POST", proxy.url + "/v1/chat/completions", json=full, headers=_auth(team), timeout=900
    ) as r:
        for chunk in r.iter_bytes():  # never held whole: the client side stays small
            size += len(chunk)
            last = [*last, chunk][-4:]
    events = [e[6:] for e in b"".join(last).split(b"\n\n") if e.startswith(b"data: ")]
    usage = next(
        (
            orjson.loads(e).get("usage")
            for e in reversed(events)
            if e.startswith(b"{") and b'"usage"' in e
        ),
        None,
    )
    return {
        "status": r.status_code,
        "bytes": size,
        "ends_with": events[-1][:60].decode() if events else None,
        "charged_usd": (usage or {}).get("cost_usd"),
    }


def _during(proxy: Proxy, team: str, body: dict[str, Any]) -> dict[str, Any]:
    """Stream `body` while polling /healthz and the reservation; the slowest /healthz."""
    done = threading.Event()
    slowest, reserved = [0.0], [0.0]

    def poll() -> None:
        with httpx.Client(timeout=300) as c:
            while not done.is_set():
                t0 = time.perf_counter()
                c.get(proxy.url + "/healthz")
                slowest[0] = max(slowest[0], time.perf_counter() - t0)
                reserved[0] = max(reserved[0], proxy.budget(team)["reserved_usd"])
                time.sleep(0.05)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    t0 = time.perf_counter()
    try:
        out = _stream(proxy, team, body)
    finally:
        done.set()
        t.join(timeout=300)
    return {
        **out,
        "seconds": round(time.perf_counter() - t0, 2),
        "slowest_healthz_s": round(slowest[0], 3),
        "max_reserved_usd": reserved[0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=HERE, help="whose proxy to run")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--mb", default="60", help="size of the stream without usage")
    parser.add_argument("--rss-mb", default="0", help="size of the stream for peak RSS; 0: skip")
    a = parser.parse_args(argv)
    prefix = f"usage-safety-{int(time.time())}"
    report: dict[str, Any] = {"checkout": str(a.checkout)}
    with running_fault_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "router.yaml"
        _config(cfg, upstream, a.redis_url, prefix)
        proxy = Proxy(a.checkout, cfg)
        try:
            report["huge_usage"] = _post(proxy, "huge", _ask("huge_usage"))
            report["huge_usage_stream"] = _stream(proxy, "huge", _ask("huge_usage"))
            report["huge_team"] = proxy.settled("huge")
            report["negative_usage_setup"] = _post(proxy, "negative", _ask("none"))
            report["negative_team_before"] = proxy.settled("negative")
            report["negative_usage"] = _post(proxy, "negative", _ask("negative_usage"))
            report["negative_usage_stream"] = _stream(proxy, "negative", _ask("negative_usage"))
            report["negative_team_after"] = proxy.settled("negative")
            report[f"stream_{a.mb}mb_no_usage"] = _during(
                proxy, "no_usage", _ask("stream_huge_no_usage", fault_mb=a.mb)
            )
            report["no_usage_team"] = proxy.settled("no_usage")
            report[f"stream_{a.mb}mb_no_usage_no_max_tokens"] = _during(
                proxy, "unbounded", _ask("stream_huge_no_usage", False, fault_mb=a.mb)
            )
            report["unbounded_team"] = proxy.settled("unbounded")
            if float(a.rss_mb) > 0:  # no max_tokens: the whole stream is counted
                before = _hwm_mb(proxy.proc.pid)
                out = _stream(proxy, "rss", _ask("stream_huge_no_usage", False, fault_mb=a.rss_mb))
                report[f"stream_{a.rss_mb}mb_rss"] = {
                    **out,
                    "peak_rss_mb_before": round(before, 1),
                    "peak_rss_mb_after": round(_hwm_mb(proxy.proc.pid), 1),
                }
        finally:
            proxy.stop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
