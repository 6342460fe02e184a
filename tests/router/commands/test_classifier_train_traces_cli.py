"""`classifier train <trace dir>`, `tune --traces <trace dir> --scores <oof>` and `simulate` on
the proxy's own trace folder (issue 13), read through the one loader. The folder is the one
tests/classifiers/test_retrain_traces.py builds: the real proxy's traces of N requests, 30 of
them rated through `POST /v1/feedback`, LABELLED labelled by a judge, a shadow file beside them.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from classifiers.compare import compare_models
from classifiers.dataset import load_dataset
from classifiers.model_files import ModelFiles
from classifiers.oof import read_scores
from classifiers.score_reference import ScoreReference, bin_counts
from router.cli import app
from router.learning.judges.feedback import append_feedback_labels
from tests.classifiers.test_retrain_traces import DATA, LABELLED, N, build_trace_folder
from trace_format.feedback import FEEDBACK_FILE
from trace_format.labels import LABELS_FILE, iter_labels

runner = CliRunner()


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_trace_folder(tmp_path_factory.mktemp("loop"))


def test_train_tune_simulate_on_the_trace_folder(trace_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "new.onnx"
    result = runner.invoke(
        app,
        [
            "classifier",
            "train",
            str(trace_dir),
            "--out",
            str(out),
            "--bootstrap",
            "200",
            "--folds",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"trained on {LABELLED} labelled rows ({N - LABELLED} unlabelled" in result.stdout
    assert "APGR      current" in result.stdout and "APGR gain (paired)" in result.stdout
    assert f"warning: only {LABELLED} labelled requests" in result.stderr
    oof = out.with_name("new.oof.jsonl")
    scores = read_scores(oof)
    assert len(scores) == LABELLED
    lines = [json.loads(line) for line in oof.read_text().splitlines()]
    assert {"request_id", "score", "fold", "current_score"} <= set(lines[0])
    # The drift reference beside the model: the distribution of those out-of-fold scores.
    reference = ScoreReference.load(ModelFiles(out).scores)
    assert reference.n == LABELLED and reference.model == "new.onnx"
    assert reference.counts.tolist() == bin_counts(np.array(list(scores.values()))).tolist()
    assert str(ModelFiles(out).scores) in result.stdout
    # The recorded comparison is the one compare_models gives on the file's own columns.
    ds = load_dataset(trace_dir, labelled_only=True)
    by_id = {line["request_id"]: line for line in lines}
    again = compare_models(
        np.array([by_id[i]["current_score"] for i in ds.ids]),
        np.array([by_id[i]["score"] for i in ds.ids]),
        ds.small,
        ds.large,
        rounds=200,
    )
    meta = json.loads(out.with_suffix(".json").read_text())
    recorded = meta["out_of_fold"]["comparison"]["delta"]["APGR"]
    assert recorded["value"] == pytest.approx(again.delta.value)

    # tune on the folder with the out-of-fold scores: the labelled requests, no re-scoring.
    result = runner.invoke(
        app,
        [
            "tune",
            "-t",
            str(trace_dir),
            "--scores",
            str(oof),
            "--target-quality",
            "0.9",
            "--bootstrap",
            "50",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"replaying {LABELLED} labelled requests; left out {N - LABELLED}" in result.stderr
    assert "threshold" in result.stdout
    result = runner.invoke(app, ["simulate", "-t", str(trace_dir), "--scores", str(oof)])
    assert result.exit_code == 0, result.output
    # Without scores: re-scored with the shipped model, which was trained on these prompts.
    result = runner.invoke(app, ["simulate", "-t", str(trace_dir)])
    assert result.exit_code == 0, result.output
    assert "are among the training prompts of model.onnx" in result.stderr


def test_train_turns_feedback_into_labels_first(trace_dir: Path, tmp_path: Path) -> None:
    # A copy of the folder as the proxy left it: the judge's labels (the last line half-written)
    # and users' feedback, none of it labelled by the feedback judge yet.
    folder = tmp_path / "traces"
    shutil.copytree(trace_dir, folder)
    labels = folder / LABELS_FILE
    kept = [ln for ln in labels.read_bytes().split(b"\n") if b'"judge":"feedback"' not in ln]
    labels.write_bytes(b"\n".join(kept).rstrip(b"\n"))
    args = ["classifier", "train", str(folder), "--folds", "0"]
    result = runner.invoke(app, [*args, "--no-feedback-labels", "--out", str(tmp_path / "a.onnx")])
    assert result.exit_code == 0, result.output
    assert not [lb for lb in iter_labels(labels) if lb.judge == "feedback"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "b.onnx")])
    assert result.exit_code == 0, result.output
    assert f"labelled 30 feedback scores in {labels}" in result.stdout
    by_judge = Counter(lb.judge for lb in iter_labels(labels))
    # The half-written line stays unreadable; it swallows no new label.
    assert by_judge == {"reference": LABELLED, "feedback": 30}
    feedback = [lb for lb in iter_labels(labels) if lb.judge == "feedback"]
    assert all(len(lb.outcomes) == 1 and lb.judge_version == "v1" for lb in feedback)
    assert append_feedback_labels(folder / FEEDBACK_FILE) == 0  # the next train adds none


def test_scores_file_missing_a_request_is_a_clean_error(trace_dir: Path, tmp_path: Path) -> None:
    partial = tmp_path / "partial.jsonl"
    partial.write_text('{"request_id": "nobody", "score": 0.5}\n')
    result = runner.invoke(
        app, ["tune", "-t", str(trace_dir), "--scores", str(partial), "--target-quality", "0.9"]
    )
    assert result.exit_code == 2
    assert "has no score in" in result.stderr and f"({LABELLED} of {LABELLED}" in result.stderr


def test_with_default_data_weighs_own_rows(
    trace_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The "shipped data" here is one small real MMLU subject (COST_ROUTER_DATA names the folder),
    # so the test trains in seconds; the command reads it as it reads the full shared folder.
    shipped = tmp_path / "shipped" / "mmlu"
    shipped.mkdir(parents=True)
    name = "mmlu_college_biology.csv"
    (shipped / name).write_bytes((DATA / "mmlu" / "responses" / name).read_bytes())
    # ...and 20 prompts the trace folder has too: left out of the default data, else their
    # out-of-fold scores would come from models trained on them.
    with (DATA / "mmlu" / "responses" / "mmlu_high_school_psychology.csv").open(
        newline="", encoding="utf-8"
    ) as fh:
        rows = list(csv.reader(fh))[:21]
    with (shipped / "overlap.csv").open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    monkeypatch.setenv("COST_ROUTER_DATA", str(shipped.parent))
    out = tmp_path / "mixed.onnx"
    result = runner.invoke(
        app,
        [
            "classifier",
            "train",
            str(trace_dir),
            "--with-default-data",
            "--own-weight",
            "3",
            "--folds",
            "2",
            "--out",
            str(out),
            "--bootstrap",
            "100",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "left out 20 rows of the default data whose prompts are in DATA" in result.stderr
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["base_rows"] == len(load_dataset(shipped / name))
    assert meta["own_rows"] == LABELLED and meta["own_weight"] == 3.0
    assert meta["base_rows"] > 100 and meta["rows"] == LABELLED + meta["base_rows"]
    # Only the labelled traffic is scored out of fold.
    assert len(read_scores(out.with_name("mixed.oof.jsonl"))) == LABELLED
