"""GSM8K rows as the proxy would have logged them, for the distillation lever (issue 28).

The shared RouteLLM GSM8K file keeps GPT-4's and Mixtral's full answers and whether each was
right. `write_traces` turns rows into what a proxy with content storage on, a shadow tier and
the reference judge writes in its trace folder:

- `requests.jsonl`: one trace record per prompt, answered by the `large` tier (GPT-4), with
  the prompt text and messages (`traces.include_prompt`) and `metadata` carrying the workflow
  tag and, where the data has one, the gold answer (`reference_answer`, the last number of a
  correct answer: the small model's, else the large one's, as simulations/levers/prompts.py);
  each prompt is its own conversation (`session`);
- `shadow.jsonl`: the pair GPT-4 (primary, the teacher) and Mixtral (shadow), texts stored;
- `labels.jsonl`: the reference judge's outcomes, from RouteLLM's correctness columns.

`cost-router distill export --traces OUT --teacher large` then reads it like live traffic.
The whole acceptance run (export, train, serve, trial) is benchmarks/distill_e2e.py.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import orjson

from router.learning.judges.reference import last_number
from trace_format.labels import LABELS_FILE, LabelRecord
from trace_format.shadow import SHADOW_FILE

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "routellm" / "gsm8k" / "gsm8k_responses.csv"
LARGE, SMALL = "gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"
T0 = 1_767_000_000.0


def gold(row: dict[str, str]) -> str | None:
    for model in (SMALL, LARGE):
        if row[model] == "True" and (n := last_number(row[f"{model}_response"])) is not None:
            return f"{n:g}"
    return None


def write_traces(
    csv_path: Path = GSM8K,
    out: Path = Path("gsm8k-traces"),
    n: int | None = None,
    team: str = "math",
    policy: str = "default",
) -> int:
    """Write the first `n` rows (all: None) as a trace folder at `out`; the rows written."""
    csv.field_size_limit(1 << 26)
    with csv_path.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))[:n]
    out.mkdir(parents=True, exist_ok=True)
    with (
        (out / "requests.jsonl").open("wb") as traces,
        (out / SHADOW_FILE).open("wb") as shadow,
        (out / LABELS_FILE).open("wb") as labels,
    ):
        for i, row in enumerate(rows):
            rid, t = f"gsm8k-{i:04d}", T0 + i
            prompt, answer = row["prompt"], row[f"{LARGE}_response"]
            metadata: dict[str, str] = {"workflow": "gsm8k"}
            if (g := gold(row)) is not None:
                metadata["reference_answer"] = g
            msgs = [{"role": "user", "content": prompt}]
            trace = {
                "schema_version": 1,
                "id": rid,
                "time": t,
                "team": team,
                "policy": policy,
                "tier": "large",
                "model": LARGE,
                "reason": "score above threshold",
                "status": 200,
                "endpoint": "chat/completions",
                "prompt_tokens": len(prompt) // 4,
                "completion_tokens": len(answer) // 4,
                "prompt": prompt,
                "messages": msgs,
                "metadata": metadata,
                "session": rid,
                "turn": 1,
                "source": "gsm8k",
            }
            side = {"prompt_tokens": len(prompt) // 4, "latency_ms": 0.0, "cost_usd": 0.0}
            record = {
                "schema_version": 1,
                "request_id": rid,
                "time": t,
                "team": team,
                "policy": policy,
                "endpoint": "chat/completions",
                "prompt": prompt,
                "primary": {"tier": "large", "model": LARGE, "text": answer, **side},
                "shadow": {
                    "tier": "small",
                    "model": SMALL,
                    "text": row[f"{SMALL}_response"],
                    **side,
                },
            }
            label = LabelRecord(
                request_id=rid,
                judge="reference",
                judge_version="v1:numeric",
                outcomes={
                    "large": 1.0 if row[LARGE] == "True" else 0.0,
                    "small": 1.0 if row[SMALL] == "True" else 0.0,
                },
                time=t,
            )
            traces.write(orjson.dumps(trace) + b"\n")
            shadow.write(orjson.dumps(record) + b"\n")
            labels.write(label.line())
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=GSM8K)
    ap.add_argument("--out", type=Path, default=Path("gsm8k-traces"))
    ap.add_argument("--n", type=int, default=None, help="first N rows (default: all)")
    args = ap.parse_args(argv)
    written = write_traces(args.csv, args.out, args.n)
    print(f"wrote {written} GSM8K requests as traces, shadow pairs and labels to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
