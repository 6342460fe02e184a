"""The simulator's commands end to end through the real `cost-router` CLI app."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from backends.signal_snapshots import save_snapshot
from router.cli import app
from router.config import load_config, simulator_defaults
from simulations.replay import trace_scores
from simulations.sim_config import SIMULATOR_DEFAULTS, default_sim_config
from simulations.trace_loader import load_trace
from tests.simulations.test_signal_levers import measured_large
from tests.support.sim import GSM8K, balanced, router_config_dict, write_jsonl_trace

runner = CliRunner()


def _run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


def test_tune_writes_threshold_into_policy(tmp_path: Path) -> None:
    config_file = tmp_path / "router.yaml"
    config_file.write_text(yaml.safe_dump(router_config_dict(threshold=0.5)))
    out_json, chart = tmp_path / "tune.json", tmp_path / "pareto.html"
    code, out = _run(
        "tune",
        "--traces",
        str(GSM8K),
        "--target-quality",
        "0.95",
        "--write",
        str(config_file),
        "--bootstrap",
        "200",
        "--json",
        str(out_json),
        "--chart",
        str(chart),
    )
    assert code == 0, out
    result = json.loads(out_json.read_text())
    assert result["quality_ratio"] >= 0.95
    ci = result["ci95"]["quality_ratio"]
    assert ci["low"] <= result["quality_ratio"] <= ci["high"]
    assert "threshold" in out and "95% CI" in out and f"{result['threshold']:.4f}" in out
    written = load_config(config_file).policies["balanced"].model_extra["threshold"]
    assert written == pytest.approx(result["threshold"])
    assert "data:image/png;base64," in chart.read_text()


def test_tune_write_keeps_environment_overrides_out_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bug 1: `tune --write` saved COST_ROUTER__* values into the user's YAML (8080 became 9999).
    config_file = tmp_path / "router.yaml"
    config_file.write_text(yaml.safe_dump(router_config_dict(threshold=0.5, server={"port": 8080})))
    monkeypatch.setenv("COST_ROUTER__SERVER__PORT", "9999")
    code, out = _run(
        "tune",
        "--traces",
        str(GSM8K),
        "--max-large-share",
        "0.3",
        "--write",
        str(config_file),
        "--bootstrap",
        "0",
    )
    assert code == 0, out
    written = yaml.safe_load(config_file.read_text())
    assert written["server"] == {"port": 8080}
    assert written["policies"]["balanced"]["threshold"] != 0.5
    assert load_config(config_file).server.port == 9999  # the override still applies when loading


def _simulate_summary(tmp_path: Path, *args: str) -> dict:
    out_json = tmp_path / "s.json"
    code, out = _run("simulate", "--traces", str(GSM8K), "--json", str(out_json), *args)
    assert code == 0, out
    return json.loads(out_json.read_text())["summary"]


def test_environment_overrides_apply_to_the_simulators_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without --config, COST_ROUTER__* overrides apply to the defaults as to a config file.
    config_file = tmp_path / "router.yaml"
    config_file.write_text(yaml.safe_dump(router_config_dict(threshold=0.9)))
    at_09 = _simulate_summary(tmp_path, "--config", str(config_file))
    default = _simulate_summary(tmp_path)
    assert at_09["share"] != default["share"]  # 0.9 routes this trace unlike the card's threshold
    # The defaults have no `policies:` (as the demo): an override names the type, as it would there.
    monkeypatch.setenv("COST_ROUTER__POLICIES__BALANCED__TYPE", "threshold")
    monkeypatch.setenv("COST_ROUTER__POLICIES__BALANCED__THRESHOLD", "0.9")
    monkeypatch.setenv("COST_ROUTER__SERVER__PORT", "9999")  # a section the simulator ignores
    assert _simulate_summary(tmp_path) == at_09
    monkeypatch.setenv("COST_ROUTER__POLICIES__BALANCED__THRESHOLD", "high")
    code, out = _run("simulate", "--traces", str(GSM8K))
    assert code == 2 and "policies.balanced.threshold" in out


def test_the_module_defaults_are_unchanged_by_environment_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = copy.deepcopy(dict(SIMULATOR_DEFAULTS))
    monkeypatch.setenv("COST_ROUTER__POLICIES__BALANCED__TYPE", "threshold")
    monkeypatch.setenv("COST_ROUTER__POLICIES__BALANCED__THRESHOLD", "0.9")
    monkeypatch.setenv("COST_ROUTER__TIERS__1__PRICE__INPUT_PER_MTOK", "99")
    overridden = simulator_defaults()
    assert (overridden.policies["balanced"].model_extra or {})["threshold"] == 0.9
    assert overridden.prices["large"].input_per_mtok == 99
    assert before == SIMULATOR_DEFAULTS
    shipped = default_sim_config()  # never reads the environment
    assert shipped.policies == {}  # the built-in default policy, as in the demo
    assert shipped.prices["large"].input_per_mtok == 10.0


def test_tune_and_write_a_load_shedding_policy(tmp_path: Path) -> None:
    # Bug 2: a `threshold` policy with `load_shed` "has no single threshold to sweep".
    config_file = tmp_path / "router.yaml"
    shed = {**balanced(0.5), "load_shed": {"max_waiting": 4, "margin": 0.1}}
    config_file.write_text(
        yaml.safe_dump(router_config_dict(policies={"balanced": balanced(0.5), "shed": shed}))
    )
    code, out = _run(
        "tune",
        "--traces",
        str(GSM8K),
        "--target-quality",
        "0.9",
        "--policy",
        "shed",
        "--write",
        str(config_file),
        "--bootstrap",
        "0",
    )
    assert code == 0, out
    entry = yaml.safe_load(config_file.read_text())["policies"]["shed"]
    assert entry["load_shed"] == shed["load_shed"] and entry["threshold"] != 0.5
    assert "wrote policies.shed.threshold" in out


def test_bad_config_is_a_clean_error(tmp_path: Path) -> None:
    data = router_config_dict()
    del data["tiers"][1]["price"]
    config_file = tmp_path / "router.yaml"
    config_file.write_text(yaml.safe_dump(data))
    code, out = _run("simulate", "--traces", str(GSM8K), "--config", str(config_file))
    assert code == 2
    assert "tiers.1.price" in out


def test_tune_unreachable_target_is_a_clean_error() -> None:
    code, out = _run("tune", "--traces", str(GSM8K), "--target-cost", "0.0001", "--bootstrap", "0")
    assert code == 2
    # (The shipped model was trained on GSM8K: a note on stderr says the data is in-sample.)
    assert "error: no threshold meets cost <= $0.0001" in out


def test_simulate_and_budgets(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_jsonl_trace(trace, 60)
    config_file = tmp_path / "router.yaml"
    data = router_config_dict(
        threshold=0.2, teams={"alpha": {"budget": {"limit_usd": 0.002, "period": "daily"}}}
    )
    data["policies"]["everything-large"] = {"type": "fixed", "tier": "large"}
    config_file.write_text(yaml.safe_dump(data))
    decisions = tmp_path / "d.jsonl"
    code, out = _run(
        "simulate",
        "-t",
        str(trace),
        "-c",
        str(config_file),
        "--budgets",
        "--compare",
        "--decisions",
        str(decisions),
        "--json",
        str(tmp_path / "s.json"),
    )
    assert code == 0, out
    assert "budget_pacing" in out and "alpha" in out and "everything-large" in out
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["summary"]["requests"] == 60
    assert len(result["budgets"]) == 2
    fixed = next(p for p in result["policies"] if p["policy"] == "everything-large")
    assert fixed["share"]["large"] == 1.0
    rows = [json.loads(line) for line in decisions.read_text().splitlines()]
    assert len(rows) == 60
    assert all((r["tier"] == "large") == (r["score"] >= 0.2) for r in rows)
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(result["summary"]["cost_usd"])


def test_what_if_lists_each_lever_before_combinations(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_jsonl_trace(trace, 80, rate_per_s=3)
    # A threshold that routes part of this trace large, whatever the model's score scale.
    scores = trace_scores(load_trace([trace]), None)
    config_file = tmp_path / "router.yaml"
    config_file.write_text(yaml.safe_dump(router_config_dict(threshold=float(np.median(scores)))))
    code, out = _run(
        "what-if",
        "-t",
        str(trace),
        "-c",
        str(config_file),
        "--json",
        str(tmp_path / "w.json"),
        "--chart",
        str(tmp_path / "lat.png"),
    )
    assert code == 0, out
    rows = json.loads((tmp_path / "w.json").read_text())
    levers = [r["lever"] for r in rows]
    assert levers == sorted(levers, key=["baseline", "alone", "combined"].index)
    by = {r["scenario"]: r for r in rows}
    assert by["all-large + spec decoding"]["p50_s"] < by["all-large"]["p50_s"]
    assert by["all-large + spec decoding"]["cost_per_1k"] == by["all-large"]["cost_per_1k"]
    assert by["routed"]["cost_per_1k"] < by["all-large"]["cost_per_1k"]
    assert (tmp_path / "lat.png").read_bytes()[:4] == b"\x89PNG"


def test_synth_then_stream(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    code, text = _run(
        "synth", "--out", str(out), "--rows", "5000", "--from", str(GSM8K), "--with-scores"
    )
    assert code == 0, text
    results = []
    for extra in ([], ["--recorded-scores"]):
        js = tmp_path / f"s{len(extra)}.json"
        code, text = _run("simulate", "-t", str(out), "--stream", "--json", str(js), *extra)
        assert code == 0, text
        results.append(json.loads(js.read_text()))
    assert results[0]["summary"]["requests"] == 5000
    assert len(results[0]["sweep"]) == 201
    # Scores written by synth are the classifier's: replaying them equals re-scoring.
    assert results[1]["summary"] == results[0]["summary"]
    code, text = _run(
        "tune", "-t", str(out), "--target-quality", "0.9", "--recorded-scores", "--bootstrap", "0"
    )
    assert code == 0, text


def test_bad_trace_is_a_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema_version": 1, "id": "a", "time": 1, "prompt": "x"}\n{"id": "b"}\n')
    code, out = _run("simulate", "-t", str(bad))
    assert code == 2
    # Line 1 has no outcomes (an unlabelled request is left out); line 2 is not a trace record.
    assert "bad.jsonl: line 2: missing field 'schema_version'" in out
    bad.write_text('{"schema_version": 1, "id": "a", "time": 1, "prompt": "x"}\n')
    code, out = _run("simulate", "-t", str(bad))
    assert code == 2
    assert "no labelled requests: 1 have no outcomes" in out
    assert "bad.jsonl: line 1: missing field 'outcomes.small'" in out


def test_what_if_without_timestamps_names_arrival_rate() -> None:
    # Issue 16: what-if on data without timestamps stopped at "missing field 'time'" alone.
    res = runner.invoke(app, ["what-if", "--traces", str(GSM8K)])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr  # one line (notes about the data may come before it)
    assert "missing field 'time'" in errors[0] and "--arrival-rate" in errors[0]


def test_what_if_cli_takes_a_saved_snapshot(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    write_jsonl_trace(trace, 30)
    snap = tmp_path / "signals.json"
    save_snapshot(snap, {"large": measured_large()})
    result = CliRunner().invoke(app, ["what-if", "--traces", str(trace), "--signals", str(snap)])
    assert result.exit_code == 0, result.output
    assert "large: ttft 300.0 ms per-token 10.00 ms spec acceptance 0.750" in result.output
    assert "acceptance 0.75" in result.output  # the what-if report uses the measured rate

    bad = CliRunner().invoke(
        app, ["what-if", "--traces", str(trace), "--signals", str(tmp_path / "none.json")]
    )
    assert bad.exit_code == 2 and "cannot read signals snapshot" in bad.output


def _cells(page: str, tag: str = "td") -> list[str]:
    return re.findall(rf"<{tag}[^>]*>([^<]*)</{tag}>", page)


def test_html_reports_carry_the_tables_and_the_chart(tmp_path: Path) -> None:
    # Issue 16: the HTML reports were a PNG wrapped in a page.
    trace = tmp_path / "t.jsonl"
    write_jsonl_trace(trace, 60, rate_per_s=3)
    page = tmp_path / "w.html"
    code, out = _run(
        "what-if", "-t", str(trace), "--chart", str(page), "--json", str(tmp_path / "w.json")
    )
    assert code == 0, out
    html = page.read_text()
    rows = json.loads((tmp_path / "w.json").read_text())
    assert _cells(html, "th")[:2] == ["scenario", "lever"] and "p95 s" in _cells(html, "th")
    cells = _cells(html)
    for r in rows:  # every scenario's row, with its numbers as the text report prints them
        assert r["scenario"] in cells and f"{r['p95_s']:.3f}" in cells
    assert "60 requests, the trace&#x27;s arrival times" in html
    assert html.index("<table>") < html.index("data:image/png;base64,")

    tuned = tmp_path / "p.html"
    code, out = _run(
        "tune",
        "--traces",
        str(GSM8K),
        "--max-large-share",
        "0.3",
        "--bootstrap",
        "50",
        "--chart",
        str(tuned),
    )
    assert code == 0, out
    html = tuned.read_text()
    assert "the chosen threshold" in html and "Pareto front" in html
    assert "threshold" in _cells(html) and "large share" in _cells(html)
    assert "data:image/png;base64," in html


def test_a_chart_path_of_another_kind_is_refused_before_the_work(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_jsonl_trace(trace, 20)
    res = runner.invoke(app, ["what-if", "-t", str(trace), "--chart", str(tmp_path / "x.svg")])
    assert res.exit_code == 2
    chart = tmp_path / "x.svg"
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: {chart}: chart files must end in .png or .html"
    )


def test_simulate_budgets_counts_large_as_the_headline_does(tmp_path: Path) -> None:
    """Issue 25, item 3: with a calibrating policy the headline's share large and the budget
    table's `large` come from the same decisions (not the starting threshold's)."""
    trace = tmp_path / "t.jsonl"
    write_jsonl_trace(trace, 400, seed=5, rate_per_s=0.1, start=1_790_000_000.0)
    scores = trace_scores(load_trace([trace]), None)
    data = router_config_dict(
        teams={"alpha": {"budget": {"limit_usd": 1e6, "period": "daily"}}},
    )
    data["policies"]["balanced"] = {
        "type": "threshold",
        "small": "small",
        "large": "large",
        "target_large_share": 0.5,
        "calibrate": {"start_threshold": float(np.quantile(scores, 0.05)), "warmup_requests": 40},
    }
    config_file = tmp_path / "router.yaml"
    config_file.write_text(yaml.safe_dump(data))
    code, out = _run(
        "simulate", "-t", str(trace), "-c", str(config_file), "--budgets",
        "--json", str(tmp_path / "s.json"),
    )  # fmt: skip
    assert code == 0, out
    result = json.loads((tmp_path / "s.json").read_text())
    share = result["summary"]["share"]["large"]
    assert 0.3 < share < 0.7, out  # calibrated, not the start's ~95%
    large = sum(t["large"] for t in result["budgets"])
    assert large == round(share * 400), out
    headline = re.search(r"share large\s+([\d.]+)%", out)
    assert headline is not None and float(headline.group(1)) == pytest.approx(share * 100, abs=0.01)
