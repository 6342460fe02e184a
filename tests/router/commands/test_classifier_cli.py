"""`cost-router classifier train|eval|score|bench` through typer's CliRunner."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from classifiers.dataset import load_dataset, routellm_data_dir
from router.cli import app

DATA = routellm_data_dir()
runner = CliRunner()


@pytest.fixture(scope="module")
def small_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = load_dataset(DATA)
    rng = np.random.default_rng(0)
    rows = np.concatenate(
        [
            np.flatnonzero(data.benchmark == "gsm8k")[:250],
            rng.choice(np.flatnonzero(data.benchmark == "mmlu"), 250, replace=False),
        ]
    )
    path = tmp_path_factory.mktemp("data") / "bench" / "outcomes.csv"
    path.parent.mkdir()
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["prompt", "cheap", "pricey"])
        for i in rows:
            writer.writerow([data.prompts[i], bool(data.small[i]), bool(data.large[i])])
    return path


@pytest.fixture(scope="module")
def trained(small_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "m.onnx"
    args = ["classifier", "train", str(small_csv), "--small", "cheap", "--large", "pricey"]
    result = runner.invoke(app, [*args, "--out", str(out), "--seed", "3", "--folds", "0"])
    assert result.exit_code == 0, result.output
    return out


def test_train_writes_model_and_metadata(trained: Path) -> None:
    meta = json.loads(trained.with_suffix(".json").read_text())
    assert meta["train_config"]["seed"] == 3
    assert meta["small_model"] == "cheap" and meta["rows"] == 500
    assert meta["onnx_bytes"] == trained.stat().st_size


def test_train_is_reproducible(small_csv: Path, trained: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.onnx"
    args = ["classifier", "train", str(small_csv), "--small", "cheap", "--large", "pricey"]
    result = runner.invoke(app, [*args, "--out", str(again), "--seed", "3", "--folds", "0"])
    assert result.exit_code == 0, result.output
    assert again.read_bytes() == trained.read_bytes()


def test_train_with_several_sources_is_reproducible_and_uses_the_source_prior(
    small_csv: Path, tmp_path: Path
) -> None:
    # One file per source (the MMLU layout): the source prior needs 2+ sources to switch on.
    folder = tmp_path / "bench"
    folder.mkdir()
    with small_csv.open(encoding="utf-8", newline="") as handle:
        records = list(csv.reader(handle))
    for name, part in (("first", records[1:251]), ("second", records[251:])):
        with (folder / f"{name}.csv").open("w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows([records[0], *part])
    args = ["classifier", "train", str(folder), "--small", "cheap", "--large", "pricey"]
    models = []
    for out in (tmp_path / "a.onnx", tmp_path / "b.onnx"):
        result = runner.invoke(app, [*args, "--out", str(out), "--seed", "3", "--folds", "0"])
        assert result.exit_code == 0, result.output
        models.append(out.read_bytes())
    assert models[0] == models[1]
    graph = onnx.load_from_string(models[0]).graph
    assert sum(node.op_type == "Softmax" for node in graph.node) == 2  # the prior's and the model's


def test_train_missing_column_is_a_clear_error(small_csv: Path, tmp_path: Path) -> None:
    args = ["classifier", "train", str(small_csv), "--small", "cheap", "--large", "absent"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "x.onnx")])
    assert result.exit_code == 2
    assert "line 1: missing column 'absent'" in result.output


def test_eval_reports_metrics_with_random_baseline(small_csv: Path, trained: Path) -> None:
    args = ["classifier", "eval", str(small_csv), "--small", "cheap", "--large", "pricey"]
    result = runner.invoke(app, [*args, "--model", str(trained), "--rounds", "50", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)  # the in-sample note goes to stderr
    assert "500 of 500 prompts (100%) are among the training prompts" in result.stderr
    assert set(out) == {"bench"}
    router = out["bench"]["router"]
    assert set(router) == {"AUC", "APGR", "CPT(50%)", "CPT(80%)"}
    apgr = router["APGR"]
    assert apgr["low"] <= apgr["value"] <= apgr["high"]
    assert "APGR" in out["bench"]["random"]
    table = runner.invoke(app, [*args, "--model", str(trained), "--rounds", "20"])
    assert table.exit_code == 0 and "random" in table.output


def test_score_stdin_and_file_keep_order(trained: Path, tmp_path: Path) -> None:
    lines = [
        {"prompt": "What is 2 + 2?", "id": 1},
        {"messages": [{"role": "user", "content": "Prove Fermat's last theorem."}], "id": 2},
        {"prompt": "", "id": 3},
    ]
    text = "".join(json.dumps(x) + "\n" for x in lines)
    result = runner.invoke(app, ["classifier", "score", "--model", str(trained)], input=text)
    assert result.exit_code == 0, result.output
    out = [json.loads(line) for line in result.output.splitlines()]
    assert [o["id"] for o in out] == [1, 2, 3]
    assert all(0 <= o["score"] <= 1 for o in out)
    path = tmp_path / "in.jsonl"
    path.write_text(text)
    from_file = runner.invoke(app, ["classifier", "score", str(path), "--model", str(trained)])
    assert from_file.output == result.output


def test_score_errors(tmp_path: Path) -> None:
    result = runner.invoke(app, ["classifier", "score"], input='{"prompt": "ok"}\n{bad\n')
    assert result.exit_code == 2 and "line 2: not JSON" in result.output
    result = runner.invoke(app, ["classifier", "score"], input='{"text": "no prompt"}\n')
    assert result.exit_code == 2 and "line 1" in result.output
    missing = tmp_path / "missing.onnx"
    result = runner.invoke(app, ["classifier", "score", "--model", str(missing)], input="")
    assert result.exit_code == 2 and "missing.onnx" in result.output


def test_bench_prints_figures(small_csv: Path, trained: Path) -> None:
    args = ["classifier", "bench", "--data", str(DATA / "gsm8k"), "--model", str(trained)]
    result = runner.invoke(app, [*args, "--queries", "50", "--batch", "200"])
    assert result.exit_code == 0, result.output
    keys = ("p50_ms", "p99_ms", "batch_prompts_per_s", "batch_overlapped_per_s", "model_bytes")
    for key in (*keys, "rss_added_by_load_mb"):
        assert key in result.output


def test_long_commands_show_a_progress_bar_with_an_eta_on_a_terminal(
    small_csv: Path, trained: Path, tmp_path: Path
) -> None:
    """On a terminal, train and eval draw a bar with count and ETA; piped, they draw none (train
    prints a line per phase instead: tests/router/commands/test_classifier_train_progress.py)."""
    import subprocess
    import sys

    def run(args: list[str], tty: bool) -> str:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        if tty:  # rich treats stderr as an interactive terminal
            env.update(TTY_COMPATIBLE="1", TTY_INTERACTIVE="1")
        proc = subprocess.run(
            [sys.executable, "-m", "router.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return proc.stderr

    tiers = ["--small", "cheap", "--large", "pricey"]
    train = [
        "classifier",
        "train",
        str(small_csv),
        *tiers,
        "--folds",
        "2",
        "--bootstrap",
        "50",
        "--out",
        str(tmp_path / "m.onnx"),
    ]
    evaluate = [
        "classifier",
        "eval",
        str(small_csv),
        *tiers,
        "--model",
        str(trained),
        "--rounds",
        "50",
    ]
    for args in (train, evaluate):
        drawn = run(args, tty=True)
        assert "eta" in drawn and "/" in drawn, drawn[-500:]
        piped = run(args, tty=False)
        assert "eta" not in piped and "\x1b[" not in piped, piped[-500:]  # no bar, no escapes
