"""`cost-router classifier train` on any traffic (issue 13): open-ended only, multiple-choice
only, multi-turn chat, graded outcomes, a few hundred rows; never over the shipped model; the
in-sample warning by content (and in `classifier eval`, `tune` and `simulate`); bad options;
`--report loso` (classifiers/loso.py, tested as a library in tests/classifiers/test_loso.py).
Real RouteLLM data slices, trained through the real command."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from classifiers.config import DEFAULT_MODEL
from classifiers.dataset import load_dataset, routellm_data_dir
from classifiers.inference import DifficultyScorer
from classifiers.model_files import ModelFiles
from classifiers.oof import read_scores
from classifiers.provenance import overlap
from router.cli import app
from tests.classifiers.test_loso import write_loso_folder

DATA = routellm_data_dir()
runner = CliRunner()


def _train(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["classifier", "train", *args])
    return result.exit_code, result.stdout, result.stderr


def _trace(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _gsm8k_records(n: int | None = None) -> list[dict]:
    ds = load_dataset(DATA / "gsm8k", exclude_contaminated=False)
    rows = range(len(ds)) if n is None else range(n)
    return [
        {
            "schema_version": 1,
            "id": f"r{i}",
            "time": 1.0e9 + i,
            "prompt": ds.prompts[i],
            "outcomes": {"small": float(ds.small[i]), "large": float(ds.large[i])},
        }
        for i in rows
    ]


def test_open_ended_trace_of_913_prompts_trains(tmp_path: Path) -> None:
    # The failing case: a trace of 913 open-ended prompts stopped with "empty vocabulary".
    trace = _trace(tmp_path / "t" / "requests.jsonl", _gsm8k_records())
    out = tmp_path / "open.onnx"
    code, stdout, stderr = _train(str(trace), "--out", str(out), "--folds", "0")
    assert code == 0, stdout + stderr
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["rows"] == 913
    scores = DifficultyScorer.load(out).score_texts(
        ["What is 17 * 23?", "Name a color.\nA. red\nB. blue\nAnswer:"]
    )
    assert np.isfinite(scores).all()


def test_gsm8k_folder_alone_trains_and_reports_out_of_fold(tmp_path: Path) -> None:
    out = tmp_path / "gsm.onnx"
    code, stdout, stderr = _train(
        str(DATA / "gsm8k"), "--out", str(out), "--bootstrap", "200", "--folds", "3"
    )
    assert code == 0, stdout + stderr
    assert "trained on 905 labelled rows" in stdout
    assert "APGR gain (paired)" in stdout
    # The shipped model was trained on GSM8K: its figures here are in-sample, and it says so.
    assert "905 of 905 prompts (100%) are among the training prompts of model.onnx" in stderr
    oof = read_scores(out.with_name("gsm.oof.jsonl"))
    assert len(oof) == 905 and all(0 <= s <= 1 for s in oof.values())
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["out_of_fold"]["comparison"]["n"] == 905
    assert meta["training_prompts"]["count"] == 905


def test_multiple_choice_only_trains(tmp_path: Path) -> None:
    folder = tmp_path / "mmlu"
    folder.mkdir()
    for name in ("mmlu_anatomy.csv", "mmlu_astronomy.csv", "mmlu_virology.csv"):
        (folder / name).write_bytes((DATA / "mmlu" / "responses" / name).read_bytes())
    out = tmp_path / "mc.onnx"
    code, stdout, stderr = _train(str(folder), "--out", str(out), "--folds", "0")
    assert code == 0, stdout + stderr
    assert json.loads(out.with_suffix(".json").read_text())["rows"] > 300


def test_multi_turn_chat_with_graded_outcomes_trains(tmp_path: Path) -> None:
    # Chat traces: `messages` only (no `prompt`), several turns, judge grades in [0, 1].
    ds = load_dataset(DATA / "gsm8k", exclude_contaminated=False)
    rng = np.random.default_rng(0)
    records = []
    for i in range(400):
        grade_small = float(np.clip(ds.small[i] * 0.7 + rng.uniform(0, 0.3), 0, 1))
        grade_large = float(np.clip(ds.large[i] * 0.7 + rng.uniform(0, 0.3), 0, 1))
        records.append(
            {
                "schema_version": 1,
                "id": f"c{i}",
                "time": 1.0e9 + i,
                "messages": [
                    {"role": "system", "content": "You are a helpful tutor."},
                    {"role": "user", "content": "Hi, can you help me with homework?"},
                    {"role": "assistant", "content": "Of course. What is the question?"},
                    {"role": "user", "content": ds.prompts[i]},
                ],
                "outcomes": {"small": round(grade_small, 3), "large": round(grade_large, 3)},
            }
        )
    trace = _trace(tmp_path / "chat" / "requests.jsonl", records)
    out = tmp_path / "chat.onnx"
    code, stdout, stderr = _train(
        str(trace), "--out", str(out), "--margin", "0.1", "--bootstrap", "200", "--folds", "3"
    )
    assert code == 0, stdout + stderr
    meta = json.loads(out.with_suffix(".json").read_text())
    counts = meta["class_counts"]
    assert counts["-1"] > 0 and counts["0"] > 0 and counts["1"] > 0  # graded -> three classes
    # A few hundred rows: trains, and warns how uncertain its figures are.
    assert "warning: only 400 labelled requests" in stderr and "wide (95%)" in stderr


def test_train_never_overwrites_the_shipped_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = hashlib.sha256(DEFAULT_MODEL.read_bytes()).hexdigest()
    code, _stdout, stderr = _train(str(DATA / "gsm8k"), "--out", str(DEFAULT_MODEL))
    assert code == 2 and "is the shipped model; pass --overwrite-shipped" in stderr
    assert hashlib.sha256(DEFAULT_MODEL.read_bytes()).hexdigest() == before
    # Without --out: a timestamped file under ./models, not the package.
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = _train(str(DATA / "gsm8k"), "--folds", "0")
    assert code == 0, stdout + stderr
    written = list((tmp_path / "models").glob("model-*.onnx"))
    assert len(written) == 1 and ModelFiles(written[0]).prompts.is_file()
    assert hashlib.sha256(DEFAULT_MODEL.read_bytes()).hexdigest() == before


def test_in_sample_warning_is_by_content_for_the_shipped_model(tmp_path: Path) -> None:
    # A copy of shipped training prompts under another path, with changed case and spacing.
    ds = load_dataset(DATA / "gsm8k")
    copy = tmp_path / "elsewhere" / "copy.csv"
    copy.parent.mkdir()
    with copy.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["prompt", "a", "b"])
        for i in range(60):
            writer.writerow(["  " + ds.prompts[i].upper() + "\n", ds.small[i] > 0, ds.large[i] > 0])
        writer.writerow(["A prompt no model was trained on: 2 + 2?", False, True])
        writer.writerow(["Another unseen prompt about tides and moons.", True, True])
    assert overlap(DEFAULT_MODEL, ["A prompt no model was trained on: 2 + 2?"]).seen == 0
    result = runner.invoke(
        app, ["classifier", "eval", str(copy), "--small", "a", "--large", "b", "--rounds", "20"]
    )
    assert result.exit_code == 0, result.output
    assert "60 of 62 prompts (97%) are among the training prompts of model.onnx" in result.stderr
    # tune and simulate warn too (they re-score with the configured model, here the shipped one).
    for command in (["tune", "--target-quality", "0.9", "--bootstrap", "0"], ["simulate"]):
        result = runner.invoke(
            app,
            [
                command[0],
                "-t",
                str(copy),
                "--small-column",
                "a",
                "--large-column",
                "b",
                "--completion-tokens",
                "5",
                *command[1:],
            ],
        )
        assert result.exit_code == 0, result.output
        assert "60 of 62 prompts" in result.stderr and "in-sample" in result.stderr


def test_bad_train_options_are_clean_errors(tmp_path: Path) -> None:
    code, _o, stderr = _train(
        str(DATA / "gsm8k"), "--out", str(tmp_path / "m.onnx"), "--own-weight", "0"
    )
    assert code == 2 and "--own-weight must be > 0" in stderr
    code, _o, stderr = _train(
        str(DATA / "gsm8k"), "--out", str(tmp_path / "m.onnx"), "--folds", "1"
    )
    assert code == 2 and "--folds must be 0" in stderr
    unlabelled = _trace(
        tmp_path / "live" / "requests.jsonl",
        [{"schema_version": 1, "id": "x", "time": 1.0, "prompt": "hello"}],
    )
    code, _o, stderr = _train(str(unlabelled.parent), "--out", str(tmp_path / "m.onnx"))
    assert code == 2 and "no labelled requests" in stderr and "1 requests have no label" in stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GSM8K and four MMLU subjects, a few rows each (tests/classifiers/test_loso.py)."""
    return write_loso_folder(tmp_path_factory.mktemp("loso"))


def test_train_report_loso_prints_the_table(folder: Path, tmp_path: Path) -> None:
    # One cheap recipe (the full set is the benchmark's: benchmarks/loso.py).
    result = CliRunner().invoke(
        app,
        [
            "classifier",
            "train",
            str(folder),
            "--folds",
            "0",
            "--out",
            str(tmp_path / "m.onnx"),
            "--report",
            "loso",
            "--loso-recipe",
            "words_only",
            "--bootstrap",
            "20",
            "--include-contaminated",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "leave-one-source-out" in result.stdout and "mean held-out APGR" in result.stdout
    rows = [ln for ln in result.stdout.splitlines() if ln.startswith("words_only ")]
    assert len(rows) == 4  # one line per holdout
    assert "chosen: words_only" in result.stdout and (tmp_path / "m.onnx").is_file()
    unknown = CliRunner().invoke(
        app, ["classifier", "train", str(folder), "--report", "loso", "--loso-recipe", "nope"]
    )
    assert unknown.exit_code == 2 and "--loso-recipe: unknown nope" in unknown.stderr
    bad = CliRunner().invoke(
        app,
        [
            "classifier",
            "train",
            str(folder / "gsm8k"),
            "--folds",
            "0",
            "--out",
            str(tmp_path / "g.onnx"),
            "--report",
            "loso",
        ],
    )
    assert bad.exit_code == 2 and "--report loso: leave-one-source-out needs" in bad.stderr
