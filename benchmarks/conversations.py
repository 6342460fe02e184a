"""Conversations through two live replicas, each session mode side by side, and the simulator's
prediction of each from one trace (issue 23; docs/conversations.md).

    .venv/bin/python benchmarks/conversations.py [--conversations 1000] [--max-turns 6]
        [--target-share 0.3] [--concurrency 32] [--out DIR]

The traffic: `--conversations` ShareGPT V3 conversations with at least 3 user turns (the `data`
extra; seeded sample), each replayed turn by turn as a chat client would send it: turn k sends
the conversation's messages up to its k-th user message (the recorded answers as the assistant
turns, each message clipped to `--max-chars`), with the conversation's `x-session-id`, turns
alternating between two proxy replicas on one Redis. Both tiers are the caching echo upstream
(benchmarks/echo_upstream.py: a prompt cache per model, TTL 300 s, OpenAI's
`prompt_tokens_details.cached_tokens` in 16-token blocks), priced with cached input at 10% of
fresh input (small $0.15/$0.60, cached $0.015; large $3/$15, cached $0.30 per Mtok).

1. A pilot run in `per_request` mode at `--pilot-threshold` writes the traces the simulator
   reads (scores, token counts, cached tokens as served).
2. The simulator (simulations/sessions.py, the code `cost-router simulate --sessions` runs)
   finds, on that trace, each mode's threshold for `--target-share` of turns on large, and
   predicts each mode's cost with its cache model measured from the trace.
3. Each mode runs live at that threshold (fresh replicas, fresh upstream cache, its own Redis
   prefix), and every turn once more on the large tier (`model: large`) as the all-large base.

Printed per mode: live share of large turns, tier changes per conversation, conversations with
a change, cost as a share of all-large (charged, with caching), the simulator's predicted cost
and its error against what the replicas charged, and whether the ledger (GET /v1/budget) equals
the sum of the `x-router-cost-usd` headers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, tests/ from a checkout

from benchmarks.echo_upstream import running_echo_upstream  # noqa: E402
from benchmarks.proxy_overhead import free_port, process  # noqa: E402
from benchmarks.sharegpt import conversations  # noqa: E402
from classifiers.dataset import load_dataset, routellm_data_dir  # noqa: E402
from policies.sessions.config import MODES  # noqa: E402
from policies.spec import card_threshold  # noqa: E402
from router.config import load_config, sim_config_from  # noqa: E402
from simulations.sessions import compare_modes, load_session_trace, measure_cache  # noqa: E402
from tests.support.budgets import REDIS_URL, delete_prefix, random_prefix  # noqa: E402

# Two price sets (USD per Mtok), cached input at 10% of fresh input in both. `far`: a small tier
# 20x cheaper than large (its fresh input costs less than large's cached input, so moving down
# always saves); `near`: tiers 3.75x apart, where a long prefix cached on large costs less than
# sending it fresh to small. Neither charges cache writes: the echo upstream reports OpenAI's
# shape, which has none.
PRICE_SETS = {
    "far": {
        "small": {"input_per_mtok": 0.15, "output_per_mtok": 0.60, "cached_input_per_mtok": 0.015},
        "large": {"input_per_mtok": 3.00, "output_per_mtok": 15.00, "cached_input_per_mtok": 0.30},
    },
    "near": {
        "small": {"input_per_mtok": 0.80, "output_per_mtok": 4.00, "cached_input_per_mtok": 0.08},
        "large": {"input_per_mtok": 3.00, "output_per_mtok": 15.00, "cached_input_per_mtok": 0.30},
    },
}
PRICES = dict(PRICE_SETS["far"])
CACHE_BLOCK = 16  # the echo upstream's default
CACHE_TTL_S = 300.0


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: list[list[dict[str, str]]]  # turn k: the messages sent for the k-th user message


def sample(n: int, max_turns: int, max_chars: int, seed: int) -> list[Conversation]:
    every = list(conversations(min_user_turns=3))
    pick = np.random.default_rng(seed).choice(len(every), min(n, len(every)), replace=False)
    out = []
    for i in sorted(pick.tolist()):
        cid, messages = every[i]
        clipped = [{"role": m["role"], "content": m["content"][:max_chars]} for m in messages]
        users = [j for j, m in enumerate(clipped) if m["role"] == "user"][:max_turns]
        out.append(Conversation(f"{cid or 'c'}-{i}", [clipped[: j + 1] for j in users]))
    return out


def router_config(
    port: int, echo: str, prefix: str, traces: Path, mode: str, threshold: float
) -> dict[str, Any]:
    return {
        "server": {"port": port},
        "tiers": [
            {
                "name": name,
                "base_url": echo,
                "model": f"echo-{name}",
                "price": price,
                "max_inflight": 1024,
            }
            for name, price in PRICES.items()
        ],
        "default_policy": "conv",
        "policies": {
            "conv": {"type": "threshold", "threshold": threshold, "session": {"mode": mode}}
        },
        "budgets": {"store": "redis", "redis_url": REDIS_URL, "key_prefix": prefix},
        "traces": {"path": str(traces)},
        "signals": {"enabled": False},
    }


@contextlib.contextmanager
def replicas(tmp: Path, mode: str, threshold: float, traces: Path) -> Iterator[list[str]]:
    """Two replicas on one Redis prefix, both tiers on one fresh caching echo upstream."""
    prefix = random_prefix()
    traces.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        echo = stack.enter_context(running_echo_upstream("--cache-ttl-s", str(CACHE_TTL_S)))
        urls = []
        for i in range(2):
            port = free_port()
            cfg = router_config(port, echo, prefix, traces / f"router-{i}.jsonl", mode, threshold)
            path = tmp / f"{traces.name}-router-{i}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            stack.enter_context(
                process(
                    [sys.executable, "-m", "router.cli", "serve", "--config", str(path)],
                    f"http://127.0.0.1:{port}/healthz",
                    tmp / f"{traces.name}-router-{i}.log",
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        try:
            yield urls
        finally:
            delete_prefix(prefix)


@dataclass
class Run:
    tiers: list[list[str]]  # per conversation, the tier of each turn
    scores: list[list[float]]  # per conversation, the classifier's score of each turn
    told_usd: float  # the sum of x-router-cost-usd
    ledger_usd: float  # the team's spend as the store reports it
    errors: int
    seconds: float

    def summary(self, large: str = "large") -> dict[str, float]:
        flat = [t for conv in self.tiers for t in conv]
        changes = np.asarray(
            [sum(a != b for a, b in zip(c[:-1], c[1:], strict=True)) for c in self.tiers]
        )
        return {
            "turns": len(flat),
            "large_share": flat.count(large) / max(1, len(flat)),
            "changes_per_conversation": float(changes.mean()),
            "conversations_changed": float((changes > 0).mean()),
            "cost_usd": self.told_usd,
        }

    def disagreement(self, hard_at: float, large: str = "large") -> dict[str, float]:
        """Against per-turn routing at the same share (its threshold `hard_at`): the share of
        turns it sends large that this run served small, and of those it sends small that this
        run served large. Where the modes' quality can differ, not what it is."""
        pairs = [
            (s >= hard_at, t == large)
            for ts, ss in zip(self.tiers, self.scores, strict=True)
            for t, s in zip(ts, ss, strict=True)
        ]
        hard = [big for is_hard, big in pairs if is_hard]
        easy = [big for is_hard, big in pairs if not is_hard]
        return {
            "hard_turns_served_small": hard.count(False) / max(1, len(hard)),
            "easy_turns_served_large": easy.count(True) / max(1, len(easy)),
        }


async def drive(
    urls: list[str], convs: list[Conversation], concurrency: int, model: str = "auto"
) -> Run:
    """Each conversation's turns in order (turn k to replica k mod 2: the replicas share the
    session through Redis), `concurrency` conversations at a time."""
    tiers: list[list[str]] = [[] for _ in convs]
    scores: list[list[float]] = [[] for _ in convs]
    told = [0.0]
    errors = [0]
    gate = asyncio.Semaphore(concurrency)
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(ci: int, conv: Conversation) -> None:
            async with gate:
                for k, messages in enumerate(conv.turns):
                    r = await client.post(
                        f"{urls[(ci + k) % len(urls)]}/v1/chat/completions",
                        json={"model": model, "max_tokens": 32, "messages": messages},
                        headers={"x-session-id": conv.id},
                    )
                    if r.status_code != 200:
                        errors[0] += 1
                        continue
                    tiers[ci].append(r.headers["x-router-tier"])
                    scores[ci].append(float(r.headers.get("x-router-score", "nan")))
                    told[0] += float(r.headers["x-router-cost-usd"])

        await asyncio.gather(*(one(i, c) for i, c in enumerate(convs)))
        budget = (await client.get(f"{urls[0]}/v1/budget")).json()
    seconds = time.perf_counter() - start
    spent = [s.get("spent_usd") for s in budget.get("scopes", []) if s.get("spent_usd") is not None]
    return Run(
        tiers, scores, told[0], float(spent[0]) if spent else float("nan"), errors[0], seconds
    )


def live(
    tmp: Path,
    name: str,
    mode: str,
    threshold: float,
    convs: list[Conversation],
    concurrency: int,
    model: str = "auto",
) -> tuple[Run, Path]:
    traces = tmp / name
    with replicas(tmp, mode, threshold, traces) as urls:
        run = asyncio.run(drive(urls, convs, concurrency, model))
    return run, traces


def one_turn(tmp: Path, n: int, threshold: float, concurrency: int, seed: int) -> list[dict]:
    """RouteLLM prompts (the shared data: both models' outcomes) as one-turn sessions through
    the replicas under each mode, at the shipped classifier's default threshold: every mode
    must decide each prompt as per_request does, so the quality at that threshold (the mean
    outcome of the tier each prompt got) is unchanged."""
    data = load_dataset(routellm_data_dir())
    pick = np.sort(np.random.default_rng(seed).choice(len(data), min(n, len(data)), False))
    convs = [
        Conversation(f"rl-{i}", [[{"role": "user", "content": data.prompts[i]}]])
        for i in pick.tolist()
    ]
    rows, reference = [], None
    for mode in MODES:
        run, _ = live(tmp, f"one-turn-{mode}", mode, threshold, convs, concurrency)
        served = [t[0] if t else None for t in run.tiers]
        quality = float(
            np.mean(
                [
                    data.large[i] if t == "large" else data.small[i]
                    for i, t in zip(pick.tolist(), served, strict=True)
                ]
            )
        )
        reference = reference or served
        same = sum(a == b for a, b in zip(served, reference, strict=True))
        rows.append(
            {
                "mode": mode,
                "prompts": len(convs),
                "large_share": served.count("large") / len(served),
                "decisions_as_per_request": same / len(served),
                "quality": quality,
                "errors": run.errors,
            }
        )
        print(json.dumps(rows[-1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--max-turns", type=int, default=6, help="user turns per conversation")
    parser.add_argument("--max-chars", type=int, default=2000, help="per message")
    parser.add_argument("--target-share", type=float, default=0.3)
    parser.add_argument("--pilot-threshold", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prices", choices=sorted(PRICE_SETS), default="far")
    parser.add_argument(
        "--one-turn", type=int, default=2000, help="RouteLLM prompts as one-turn sessions (0: skip)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the summary JSON here")
    args = parser.parse_args()
    PRICES.update(PRICE_SETS[args.prices])

    convs = sample(args.conversations, args.max_turns, args.max_chars, args.seed)
    print(f"{len(convs)} conversations, {sum(len(c.turns) for c in convs)} turns")
    with tempfile.TemporaryDirectory(prefix="conversations-") as tmp_name:
        tmp = Path(tmp_name)
        pilot, pilot_traces = live(
            tmp, "pilot", "per_request", args.pilot_threshold, convs, args.concurrency
        )
        print(f"pilot: {pilot.summary()} ({pilot.seconds:.1f} s, {pilot.errors} errors)")
        cfg_path = tmp / "pilot-router-0.yaml"
        sim = sim_config_from(load_config(cfg_path))
        trace = load_session_trace([pilot_traces])
        cache = measure_cache(trace, default_ttl_s=CACHE_TTL_S, default_block=CACHE_BLOCK)
        predicted = {
            str(r["mode"]): r
            for r in compare_modes(sim, trace, cache, "conv", target_share=args.target_share)
        }
        base, _ = live(tmp, "all-large", "per_request", 0.0, convs, args.concurrency, "large")
        rows = []
        hard_at = float(predicted["per_request"]["threshold"])  # type: ignore[arg-type]
        for mode in MODES:
            threshold = float(predicted[mode]["threshold"])  # type: ignore[arg-type]
            run, _ = live(tmp, mode, mode, threshold, convs, args.concurrency)
            row = {
                "mode": mode,
                "threshold": threshold,
                **run.summary(),
                **run.disagreement(hard_at),
                "share_of_all_large": run.told_usd / base.told_usd,
                "predicted_cost_usd": float(predicted[mode]["cost_usd"]),  # type: ignore[arg-type]
                "ledger_usd": run.ledger_usd,
                "errors": run.errors,
                "seconds": run.seconds,
            }
            row["prediction_error"] = row["predicted_cost_usd"] / run.told_usd - 1
            rows.append(row)
            print(json.dumps(row))
        single = (
            one_turn(tmp, args.one_turn, card_threshold(None), args.concurrency, args.seed)
            if args.one_turn
            else []
        )
        base_pred = float(predicted["all-large"]["cost_usd"])  # type: ignore[arg-type]
        print(
            f"all-large: charged ${base.told_usd:.4f} (ledger ${base.ledger_usd:.4f}), "
            f"predicted ${base_pred:.4f} ({base_pred / base.told_usd - 1:+.2%}), "
            f"{base.errors} errors"
        )
    print()
    print(
        f"{'mode':<14}{'thr':>7}{'large':>8}{'chg/conv':>10}{'conv chg':>10}"
        f"{'cost/all-large':>16}{'sim err':>9}{'ledger==told':>14}{'hard->small':>13}"
        f"{'easy->large':>13}"
    )
    for r in rows:
        same = abs(r["ledger_usd"] - r["cost_usd"]) < 1e-6
        print(
            f"{r['mode']:<14}{r['threshold']:>7.4f}{r['large_share']:>8.1%}"
            f"{r['changes_per_conversation']:>10.2f}{r['conversations_changed']:>10.1%}"
            f"{r['share_of_all_large']:>16.1%}{r['prediction_error']:>+9.2%}{str(same):>14}"
            f"{r['hard_turns_served_small']:>13.1%}{r['easy_turns_served_large']:>13.1%}"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"out": str(args.out)},
                    "modes": rows,
                    "all_large_usd": base.told_usd,
                    "one_turn": single,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
