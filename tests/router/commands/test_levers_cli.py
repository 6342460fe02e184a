"""`cost-router levers trial|plan` through the real CLI app against real HTTP servers: the fast
echo upstream for the mechanics (resume, a tier that is down, bad input, a judge that answers
garbage), real llama.cpp servers for the lever measurement itself (test_levers_llama.py beside
this file)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from backends.metrics_scrape import ACCEPTED_TOKENS, DRAFT_TOKENS, parse_metrics
from benchmarks.echo_upstream import running_echo_upstream
from router.cli import app
from tests.support.metrics_server import FIRST, LATER, MetricsServer
from tests.support.ports import free_port
from tests.support.sim import GSM8K
from tests.support.verdict_upstream import VerdictServer
from tests.support.waiting import wait_for

runner = CliRunner()


@pytest.fixture(scope="module")
def echoes() -> Iterator[dict[str, str]]:
    # "ref" reports usage like vLLM; "cand" sends none, like llama.cpp's server.
    with (
        running_echo_upstream() as ref,
        running_echo_upstream("--no-usage", "--chunks", "4") as cand,
    ):
        yield {"ref": ref, "cand": cand}


def _tier(name: str, url: str, price: float, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "base_url": url,
        "model": name,
        "timeout_s": 10,
        "price": {"input_per_mtok": price, "output_per_mtok": price},
        **extra,
    }


def _config(tmp_path: Path, tiers: list[dict[str, Any]], **extra: Any) -> Path:
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({"tiers": tiers, "signals": {"enabled": False}, **extra}))
    return path


def _trial(config_file: Path, out: Path, *args: str) -> Any:
    return runner.invoke(
        app,
        [
            "levers",
            "trial",
            "-c",
            str(config_file),
            "--traces",
            str(GSM8K),
            "--reference",
            "ref",
            "--out",
            str(out),
            "--n",
            "4",
            *args,
        ],
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_trial_measures_judges_and_a_rerun_resumes(echoes: dict[str, str], tmp_path: Path) -> None:
    config_file = _config(
        tmp_path, [_tier("ref", echoes["ref"], 10.0), _tier("cand", echoes["cand"], 1.0)]
    )
    out = tmp_path / "trial"
    res = _trial(config_file, out, "--candidate", "cand:quantization")
    assert res.exit_code == 0, res.output
    rows = _lines(out / "requests.jsonl")
    assert (
        sorted((r["tier"], r["tokens_reported"]) for r in rows)
        == [("cand", False)] * 4 + [("ref", True)] * 4
    )
    assert all(r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"] and r["cost_usd"] > 0 for r in rows)
    assert {r["completion_tokens"] for r in rows if r["tier"] == "cand"} == {4}  # chunks counted
    judged = _lines(out / "judgements.jsonl")
    # GSM8K gold answers: the echo's text has no number, so both miss: a tie, judged by the
    # reference judge (every sampled prompt here has a correct answer in the data, or none).
    assert {j["judge"] for j in judged if j["status"] == "label"} <= {"reference"}
    assert all(
        j["reference_outcome"] == j["candidate_outcome"] == 0.0
        for j in judged
        if j["status"] == "label"
    )
    assert "quality delta" in res.output and "cand" in res.output
    doc = json.loads((out / "levers.json").read_text())
    assert doc["reference"] == "ref" and doc["quantization"]["tier"] == "cand"
    assert doc["quantization"]["cost"] == pytest.approx(0.1)  # its price on its own tokens

    again = _trial(config_file, out, "--candidate", "cand:quantization")
    assert again.exit_code == 0, again.output
    assert len(_lines(out / "requests.jsonl")) == 8  # nothing redone
    assert len(_lines(out / "judgements.jsonl")) == len(judged)

    other = _trial(config_file, out, "--candidate", "cand", "--max-tokens", "9")
    assert other.exit_code == 2
    assert "other settings" in other.stderr and "max_tokens" in other.stderr


def test_a_candidate_that_is_down_is_named_and_nothing_measured_is_lost(
    echoes: dict[str, str], tmp_path: Path
) -> None:
    down = f"http://127.0.0.1:{free_port()}/v1"
    config_file = _config(tmp_path, [_tier("ref", echoes["ref"], 10.0), _tier("cand", down, 1.0)])
    out = tmp_path / "trial"
    res = _trial(config_file, out, "--candidate", "cand")
    assert res.exit_code == 1
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith("error: tier 'cand' is down") and "rerun" in error
    assert [r["tier"] for r in _lines(out / "requests.jsonl")] == ["ref"] * 4

    # Once it is up, the rerun measures only what is missing.
    config_file = _config(
        tmp_path, [_tier("ref", echoes["ref"], 10.0), _tier("cand", echoes["cand"], 1.0)]
    )
    res = _trial(config_file, out, "--candidate", "cand")
    assert res.exit_code == 0, res.output
    assert sorted(r["tier"] for r in _lines(out / "requests.jsonl")) == ["cand"] * 4 + ["ref"] * 4


def test_a_trace_without_prompts_is_one_error_line(echoes: dict[str, str], tmp_path: Path) -> None:
    trace = tmp_path / "t" / "requests.jsonl"
    trace.parent.mkdir()
    trace.write_text(
        "".join(
            json.dumps(
                {"schema_version": 1, "id": f"r{i}", "time": 1.0 + i, "tier": "ref", "status": 200}
            )
            + "\n"
            for i in range(3)
        )
    )
    config_file = _config(
        tmp_path, [_tier("ref", echoes["ref"], 10.0), _tier("cand", echoes["cand"], 1.0)]
    )
    res = runner.invoke(
        app,
        [
            "levers",
            "trial",
            "-c",
            str(config_file),
            "--traces",
            str(trace),
            "--reference",
            "ref",
            "--candidate",
            "cand",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no prompt text" in lines[0]
    assert not (tmp_path / "o" / "requests.jsonl").exists()


def test_a_judge_that_answers_garbage_is_counted_unparsed_and_fails_the_gate(
    echoes: dict[str, str], tmp_path: Path
) -> None:
    with VerdictServer() as judge:
        judge.app.mode = "garbage"
        config_file = _config(
            tmp_path,
            [
                _tier("ref", echoes["ref"], 10.0),
                _tier("cand", echoes["cand"], 1.0),
                _tier("same", echoes["ref"], 1.0),
                _tier("judge", judge.url, 1.0),
            ],
        )
        out = tmp_path / "trial"
        res = _trial(
            config_file,
            out,
            "--candidate",
            "cand",
            "--candidate",
            "same",
            "--judge",
            "llm",
            "--judge-tier",
            "judge",
            "--max-quality-loss",
            "0.02",
        )
        asked = judge.app.served
    assert res.exit_code == 1, res.output  # the gate: quality unknown
    judged = _lines(out / "judgements.jsonl")
    assert sorted(j["status"] for j in judged if j["candidate"] == "cand") == ["unparsed"] * 4
    assert "4 pairs unparsed" in res.output
    assert "gate FAIL cand: quality unknown: no judged pair, 4 unparsed" in res.output
    # Answers identical to the reference's are a tie without asking the judge: it was asked
    # only for cand's pairs, in both orders.
    same = [j for j in judged if j["candidate"] == "same"]
    assert [(j["status"], j["verdict"]) for j in same] == [("label", "identical answers")] * 4
    assert asked == 8
    # Four identical answers are ties: too little evidence to pass (issue 25, item 2).
    assert "gate FAIL same: quality delta +0.000, lower bound -0." in res.output
    assert "0 of 4 judged pairs are not ties" in res.output


def test_the_gate_passes_and_fails_on_latency(echoes: dict[str, str], tmp_path: Path) -> None:
    config_file = _config(
        tmp_path, [_tier("ref", echoes["ref"], 10.0), _tier("cand", echoes["cand"], 1.0)]
    )
    out = tmp_path / "trial"
    ok = _trial(config_file, out, "--candidate", "cand", "--max-p95-latency-s", "30")
    assert ok.exit_code == 0, ok.output
    assert "gate PASS cand: p95 latency" in ok.output
    summary = json.loads((out / "summary.json").read_text())
    assert [r["name"] for r in summary["rows"]] == ["ref", "cand"]
    assert summary["rows"][1]["quality"]["delta"]["value"] == 0.0
    assert summary["gate"] == [
        {"row": "cand", "passed": True, "reasons": summary["gate"][0]["reasons"]}
    ]
    strict = _trial(config_file, out, "--candidate", "cand", "--max-p95-latency-s", "0.000001")
    assert strict.exit_code == 1
    assert "gate FAIL cand: p95 latency" in strict.output


def test_a_plan_runs_alone_then_combined_in_one_table(
    echoes: dict[str, str], tmp_path: Path
) -> None:
    config_file = _config(
        tmp_path,
        [
            _tier("ref", echoes["ref"], 10.0),
            _tier("cand", echoes["cand"], 1.0),
            _tier("spec", echoes["ref"], 10.0),
        ],
    )
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "reference": "ref",
                "traces": [str(GSM8K)],
                "n": 4,
                "large_share": 0.5,
                "candidates": [
                    {"tier": "cand", "lever": "quantization"},
                    {"tier": "spec", "lever": "speculative"},
                ],
                "combinations": [
                    {"name": "routed + quantized small", "small": "cand", "large": "ref"},
                    {"name": "all together", "small": "cand", "large": "spec"},
                ],
            }
        )
    )
    out = tmp_path / "trial"
    res = runner.invoke(
        app, ["levers", "plan", str(plan), "-c", str(config_file), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    names = [
        line.split()[0]
        for line in res.stdout.splitlines()
        if line.split() and line.split()[0] in ("ref", "cand", "spec", "routed", "all")
    ]
    assert names == ["ref", "cand", "spec", "routed", "all"]
    assert "routed + quantized small (50% large)" in res.stdout  # large_share -> threshold
    # The same model answers "spec" and "ref": identical outputs, and no acceptance counters.
    assert "not exposed" in res.stdout
    doc = json.loads((out / "levers.json").read_text())
    assert doc["speculative"]["identical_share"] == 1.0
    assert doc["speculative"]["acceptance"] is None

    # `trial --plan` is the same run: it resumes this one, nothing is measured again.
    again = runner.invoke(
        app, ["levers", "trial", "--plan", str(plan), "-c", str(config_file), "--out", str(out)]
    )
    assert again.exit_code == 0, again.output
    assert len(_lines(out / "requests.jsonl")) == 12

    twice = _trial(config_file, out / "x", "--candidate", "ref")
    assert twice.exit_code == 2 and "each tier once, and not the reference" in twice.stderr
    lever = _trial(config_file, out / "x", "--candidate", "cand:pruning")
    assert lever.exit_code == 2 and "LEVER one of quantization" in lever.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "reference": "ref",
                "candidates": [{"tier": "cand"}],
                "combinations": [{"name": "x", "small": "nope", "large": "ref"}],
            }
        )
    )
    res = runner.invoke(
        app, ["levers", "plan", str(bad), "-c", str(config_file), "--traces", str(GSM8K)]
    )
    assert res.exit_code == 2
    assert "combinations.0.small: unknown tier 'nope'" in res.stderr


def test_what_if_uses_the_measured_levers_and_says_which_are_assumed(
    echoes: dict[str, str], tmp_path: Path
) -> None:
    config_file = _config(
        tmp_path, [_tier("ref", echoes["ref"], 10.0), _tier("cand", echoes["cand"], 1.0)]
    )
    out = tmp_path / "trial"
    assert _trial(config_file, out, "--candidate", "cand:quantization").exit_code == 0
    res = runner.invoke(
        app,
        [
            "what-if",
            "--traces",
            str(GSM8K),
            "--arrival-rate",
            "2",
            "--levers",
            str(out / "levers.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "quantized small price x 0.1 [measured: cand vs ref, levers.json]" in res.stdout
    assert "spec acceptance 0.7 [assumed: not in the trial]" in res.stdout
    assert "routed + quantized small" in res.stdout

    broken = tmp_path / "levers.json"
    broken.write_text(json.dumps({"schema": 1, "quantization": {"speed": "fast"}}))
    res = runner.invoke(
        app, ["what-if", "--traces", str(GSM8K), "--arrival-rate", "2", "--levers", str(broken)]
    )
    assert res.exit_code == 2
    assert "quantization.speed: expected a number" in res.stderr


def test_speculative_acceptance_is_read_from_the_servers_counters(tmp_path: Path) -> None:
    """A vLLM-style /metrics (the fixture files, served over real HTTP) beside a speculative
    tier: the acceptance is the growth of accepted over drafted tokens during its run."""
    first, later = parse_metrics(FIRST).counters, parse_metrics(LATER).counters
    expected = (later[ACCEPTED_TOKENS] - first[ACCEPTED_TOKENS]) / (
        later[DRAFT_TOKENS] - first[DRAFT_TOKENS]
    )
    metrics = MetricsServer()
    try:
        with running_echo_upstream() as ref, running_echo_upstream("--delay-ms", "150") as spec:
            config_file = _config(
                tmp_path,
                [
                    _tier("ref", ref, 10.0),
                    _tier("spec", spec, 10.0, metrics_url=metrics.endpoint().metrics_url),
                ],
            )
            out = tmp_path / "trial"

            def grow_counters() -> None:
                # Once the spec tier's first request is on disk its run has begun (the counters
                # were read before it): the server's counters grow, as vLLM's do under load.
                wait_for(
                    lambda: '"tier":"spec"' in _text(out / "requests.jsonl"),
                    60,
                    "the speculative tier's first measurement",
                )
                metrics.metrics = LATER

            switch = threading.Thread(target=grow_counters, daemon=True)
            switch.start()
            res = _trial(config_file, out, "--candidate", "spec:speculative", "--concurrency", "1")
            switch.join(timeout=5)
    finally:
        metrics.close()
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "levers.json").read_text())
    assert doc["speculative"]["acceptance"] == pytest.approx(expected)
    assert f"{expected:.1%}" in res.stdout
    assert doc["speculative"]["identical_share"] == 1.0


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_failed_requests_are_counted_kept_and_retried(
    echoes: dict[str, str], tmp_path: Path
) -> None:
    faults = (
        "--fault-rate",
        "1",
        "--faults",
        "error_500,stream_cut,stream_bad_usage",
        "--seed",
        "3",
    )
    with running_echo_upstream(*faults, module="benchmarks.fault_upstream") as faulty:
        config_file = _config(
            tmp_path, [_tier("ref", echoes["ref"], 10.0), _tier("cand", faulty, 1.0)]
        )
        out = tmp_path / "trial"
        res = _trial(config_file, out, "--candidate", "cand")
    assert res.exit_code == 0, res.output
    errors = sorted(
        r["error"] or "ok" for r in _lines(out / "requests.jsonl") if r["tier"] == "cand"
    )
    assert len(errors) == 4 and "ok" not in errors, errors
    # (seed 3 draws each fault at least once for these 4 prompts)
    assert {e.split(" (")[0] for e in errors} == {
        "answered 500",
        "cut mid-stream",
        "unreadable stream",
    }, errors
    assert "Traceback" not in res.output
    # Once the server answers, a rerun measures the failed ones again.
    config_file = _config(
        tmp_path, [_tier("ref", echoes["ref"], 10.0), _tier("cand", echoes["cand"], 1.0)]
    )
    assert _trial(config_file, out, "--candidate", "cand").exit_code == 0
    rows = _lines(out / "requests.jsonl")
    assert len(rows) == 12 and all(r["error"] is None for r in rows[-4:])


def test_eight_tied_pairs_do_not_pass_the_quality_gate(
    echoes: dict[str, str], tmp_path: Path
) -> None:
    """Issue 25, item 2: `gate PASS ... lower bound +0.000 ... (8 judged pairs)` on ties only.
    The echo answers hold no number, so every GSM8K pair is a 0/0 tie."""
    config_file = _config(
        tmp_path, [_tier("ref", echoes["ref"], 10.0), _tier("cand", echoes["cand"], 1.0)]
    )
    out = tmp_path / "trial"
    args = ["--candidate", "cand:quantization", "--n", "8", "--max-quality-loss", "0.02"]
    res = _trial(config_file, out, *args)
    assert res.exit_code == 1, res.output
    gate = next(line for line in res.output.splitlines() if line.startswith("gate "))
    assert gate.startswith("gate FAIL cand: quality delta +0.000, lower bound -0.3"), gate
    assert "(8 judged pairs, 0 not ties)" in gate
    assert "too little evidence: 0 of 8 judged pairs are not ties, at least 10 needed" in gate
    # Without the minimum, the interval alone still fails: 8 ties cannot rule out a 2-point loss.
    res = _trial(config_file, out, *args, "--min-informative-pairs", "0")
    assert res.exit_code == 1, res.output
    assert "gate FAIL cand: quality delta +0.000, lower bound -0.3" in res.output
    assert "too little evidence" not in res.output
    summary = json.loads((out / "summary.json").read_text())
    delta = summary["rows"][1]["quality"]["delta"]
    assert delta["low"] < -0.3 and delta["high"] > 0.3  # not the zero-width [0, 0]
