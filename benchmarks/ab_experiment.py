"""A/B experiment end to end on real prompts: the proxy (`cost-router serve`, a subprocess) in
front of two echo upstreams, GSM8K prompts from the RouteLLM data sent with the official `openai`
client by simulated users, feedback = whether the answering tier's real model (Mixtral for small,
GPT-4 for large, from the RouteLLM outcomes) got that prompt right, then `cost-router ab report`
on the proxy's own traces.

Arms: control = everything on the large tier (fixed); treatment = threshold routing with the
threshold given as a target large share, converted on a reference trace rescored by the shipped
classifier.

    .venv/bin/python benchmarks/ab_experiment.py --requests 400 --users 80 --out /tmp/ab.png
"""

from __future__ import annotations

import argparse
import csv
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from openai import OpenAI

from benchmarks.echo_upstream import running_echo_upstream
from classifiers.dataset import routellm_data_dir

DATA = routellm_data_dir() / "gsm8k"
SMALL_MODEL, LARGE_MODEL = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"


def load_prompts() -> list[dict[str, Any]]:
    with (DATA / "gsm8k_responses.csv").open(newline="", encoding="utf-8") as fh:
        return [
            {
                "prompt": r["prompt"],
                "small": r[SMALL_MODEL] == "True",
                "large": r[LARGE_MODEL] == "True",
            }
            for r in csv.DictReader(fh)
        ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(workdir: Path, small: str, large: str, reference: Path, share: float) -> Path:
    def tier(name: str, url: str, price: tuple[float, float]) -> dict[str, Any]:
        return {
            "name": name,
            "base_url": url,
            "model": f"{name}-model",
            "price": {"input_per_mtok": price[0], "output_per_mtok": price[1]},
        }

    doc = {
        "tiers": [tier("small", small, (0.6, 0.6)), tier("large", large, (10, 30))],
        "traces": {"path": str(workdir / "traces" / "requests.jsonl")},
        "signals": {"enabled": False},
        "default_policy": "all-large",
        "policies": {
            "all-large": {"type": "fixed", "tier": "large"},
            "routed": {
                "type": "threshold",
                "target_large_share": share,
                "reference_trace": str(reference),
                "rescore": True,
            },
        },
        "experiments": [
            {
                "name": "routing-ab",
                "unit": "user",
                "salt": "bench",
                "arms": {
                    "control": {"policy": "all-large", "weight": 1},
                    "treatment": {"policy": "routed", "weight": 1},
                },
            }
        ],
    }
    path = workdir / "router.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start_proxy(config: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "router.cli",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"proxy exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("proxy did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--users", type=int, default=80)
    ap.add_argument("--share", type=float, default=0.4, help="treatment's target large share")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="chart (.png/.html)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    rows = load_prompts()
    rng = random.Random(a.seed)
    rng.shuffle(rows)
    reference, traffic = rows[:400], rows[400 : 400 + a.requests]
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ab-bench-")))
        ref_path = workdir / "reference.jsonl"
        ref_path.write_bytes(
            b"".join(
                orjson.dumps({"id": f"ref{i}", "time": 0.0, "prompt": r["prompt"]}) + b"\n"
                for i, r in enumerate(reference)
            )
        )
        small = stack.enter_context(running_echo_upstream("--delay-ms", "5"))
        large = stack.enter_context(running_echo_upstream("--delay-ms", "40"))
        config = write_config(workdir, small, large, ref_path, a.share)
        port = free_port()
        proxy = start_proxy(config, port, workdir / "proxy.log")
        try:
            base = f"http://127.0.0.1:{port}"
            client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

            def one(i: int) -> tuple[str, float]:
                row = traffic[i]
                raw = client.chat.completions.with_raw_response.create(
                    model="auto",
                    user=f"user-{i % a.users}",
                    messages=[{"role": "user", "content": row["prompt"]}],
                    max_tokens=64,
                )
                tier = raw.headers["x-router-tier"]
                return raw.headers["x-router-request-id"], 1.0 if row[tier] else 0.0

            t0 = time.perf_counter()
            with ThreadPoolExecutor(a.concurrency) as pool:
                results = list(pool.map(one, range(len(traffic))))
            elapsed = time.perf_counter() - t0
            with httpx.Client(base_url=base, timeout=10) as http:
                for rid, score in results:
                    http.post(
                        "/v1/feedback", json={"request_id": rid, "score": score}
                    ).raise_for_status()
        finally:
            proxy.send_signal(signal.SIGTERM)  # drain: traces of the last requests are flushed
            proxy.wait(timeout=30)
        grep = [
            line
            for line in (workdir / "proxy.log").read_text().splitlines()
            if "target large share" in line
        ]
        print(f"{len(traffic)} requests in {elapsed:.1f}s ({a.concurrency} concurrent)")
        print("\n".join(grep) + "\n")
        cmd = [
            sys.executable,
            "-m",
            "router.cli",
            "ab",
            "report",
            "--traces",
            str(workdir / "traces"),
            "--experiment",
            "routing-ab",
            "--config",
            str(config),
        ]
        if a.out:
            cmd += ["--out", str(a.out)]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
