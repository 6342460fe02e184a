"""Training, tuning and simulating on the proxy's own trace folder (issue 13).

The real proxy (replay tiers answering from real GSM8K/MMLU prompts, prompt logging on) serves
requests sent with the official `openai` client; users rate some answers through
`POST /v1/feedback`; a judge's labels are written through trace_format.labels (the reference
outcomes of the data, as the `reference` judge would); a shadow file sits beside them. Then
`classifier train <trace dir>`, `tune --traces <trace dir> --scores <oof>` and `simulate` read
the folder through the one loader.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from typer.testing import CliRunner

from classifiers.compare import compare_models
from classifiers.dataset import load_dataset, routellm_data_dir
from classifiers.model_files import ModelFiles
from classifiers.oof import read_scores
from classifiers.score_reference import ScoreReference, bin_counts
from router.cli import app
from router.config import config_from_dict
from router.learning.judges.feedback import append_feedback_labels
from tests.support.proxy import ProxyThread
from tests.support.sim import router_config_dict
from trace_format.feedback import FEEDBACK_FILE
from trace_format.labels import LABELS_FILE, LabelRecord, iter_labels
from trace_format.reader import data_files

DATA = routellm_data_dir()
runner = CliRunner()
N = 240  # requests through the proxy; LABELLED of them get a judge's label
LABELLED = 200


def _source_trace(path: Path) -> dict[str, tuple[float, float]]:
    """A replay trace of N distinct real prompts (half GSM8K, half MMLU: the replay tiers answer
    by prompt); returns their outcomes by prompt."""
    gsm = load_dataset(DATA / "gsm8k")
    mmlu = load_dataset(DATA / "mmlu" / "responses" / "mmlu_high_school_psychology.csv")
    outcomes: dict[str, tuple[float, float]] = {}
    for ds, stop in ((gsm, N // 2), (mmlu, N)):
        for prompt, small, large in zip(ds.prompts, ds.small, ds.large, strict=True):
            if len(outcomes) == stop:
                break
            outcomes.setdefault(prompt, (float(small), float(large)))
    records = [
        {
            "schema_version": 1,
            "id": f"src-{i}",
            "time": 1.0,
            "prompt": prompt,
            "prompt_tokens": 50,
            "completion_tokens": 20,
        }
        for i, prompt in enumerate(outcomes)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return outcomes


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_trace_folder(tmp_path_factory.mktemp("loop"))


def build_trace_folder(root: Path) -> Path:
    """`root/traces`: the proxy's trace folder after N requests, 30 rated, LABELLED judged."""
    outcomes = _source_trace(root / "source.jsonl")
    folder = root / "traces"
    data = router_config_dict(
        root / "source.jsonl",
        threshold=0.55,
        traces={"path": str(folder / "requests.jsonl"), "include_prompt": True},
        signals={"enabled": False},
    )
    config = config_from_dict(data, environ={})
    sent: list[tuple[str, str, str]] = []  # (request id, tier, prompt)
    with ProxyThread(config) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        for prompt in outcomes:
            raw = client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": prompt}]
            )
            raw.parse()
            sent.append((raw.headers["x-router-request-id"], raw.headers["x-router-tier"], prompt))
        # Users rate 30 answers (the outcome of the tier that answered).
        for rid, tier, prompt in sent[:30]:
            score = outcomes[prompt][0 if tier == "small" else 1]
            r = httpx.post(f"{proxy.url}/v1/feedback", json={"request_id": rid, "score": score})
            assert r.status_code == 200, r.text
        proxy.traces(expect=N)
    # A judge labels LABELLED requests (both tiers' outcomes); one line is half-written.
    with (folder / LABELS_FILE).open("wb") as fh:
        for rid, _tier, prompt in sent[:LABELLED]:
            small, large = outcomes[prompt]
            fh.write(
                LabelRecord(
                    request_id=rid,
                    judge="reference",
                    judge_version="1",
                    outcomes={"small": small, "large": large},
                ).line()
            )
        fh.write(b'{"request_id": "half-writ')
    (folder / "shadow-answers.jsonl").write_text('{"request_id": "x", "answer": "..."}\n')
    return folder


def test_side_files_are_not_traces(trace_dir: Path) -> None:
    assert (trace_dir / FEEDBACK_FILE).is_file() and (trace_dir / LABELS_FILE).is_file()
    assert [p.name for p in data_files(trace_dir)] == ["requests.jsonl"]
    ds = load_dataset(trace_dir, labelled_only=True)
    assert len(ds) == LABELLED and ds.unlabelled == N - LABELLED and ds.from_labels == LABELLED
    assert set(np.unique(ds.small)) <= {0.0, 1.0}


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
