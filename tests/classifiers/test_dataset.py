"""The one loader: RouteLLM CSV folders/files, graded scores, our JSONL traces, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from classifiers.dataset import DatasetError, load_dataset, routellm_data_dir

DATA = routellm_data_dir()


def test_routellm_folder_drops_contaminated_and_names_benchmarks() -> None:
    data = load_dataset(DATA)
    assert data.benchmarks == ["gsm8k", "mmlu"]
    assert data.excluded_contaminated == 12
    assert len(data) == 913 + 9784 - 12
    gsm = data.benchmark == "gsm8k"
    assert gsm.sum() == 905
    assert set(np.unique(data.small)) <= {0.0, 1.0}
    assert 0.6 < data.small[gsm].mean() < data.large[gsm].mean() < 0.95
    assert data.small_responses is not None and data.small_responses[0]
    assert len(set(data.source[~gsm])) == 57
    kept = load_dataset(DATA / "gsm8k", exclude_contaminated=False)
    assert len(kept) == 913 and kept.benchmarks == ["gsm8k"]
    sub = data.subset(gsm)
    assert len(sub) == 905 and sub.small_responses is not None and len(sub.small_responses) == 905


def test_rows_keep_stable_unique_ids() -> None:
    # CSV rows: "<path relative to the folder given>:<data row>", contaminated rows counted, so
    # an id does not depend on whether they are excluded; subset() keeps each row's id.
    data = load_dataset(DATA)
    assert len(set(data.ids)) == len(data)
    kept = load_dataset(DATA, exclude_contaminated=False)
    assert kept.ids[0] == "gsm8k/gsm8k_responses.csv:1" and set(data.ids) < set(kept.ids)
    by_id = dict(zip(kept.ids, kept.prompts, strict=True))
    assert all(by_id[i] == p for i, p in zip(data.ids, data.prompts, strict=True))
    rows = np.array([5, 0, 900])
    assert data.subset(rows).ids == [data.ids[i] for i in rows]
    assert data.subset(data.benchmark == "mmlu").ids == [
        i for i, b in zip(data.ids, data.benchmark, strict=True) if b == "mmlu"
    ]
    single = DATA / "gsm8k" / "gsm8k_responses.csv"
    assert load_dataset(single, exclude_contaminated=False).ids[:2] == [
        "gsm8k_responses.csv:1",
        "gsm8k_responses.csv:2",
    ]


def _csv(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_graded_scores_and_named_columns(tmp_path: Path) -> None:
    f = _csv(tmp_path / "judge.csv", 'prompt,cheap,pricey\n"multi\nline",3,9\nq2,8,7.5\nq3,,5\n')
    data = load_dataset(f, small="cheap", large="pricey")
    assert data.prompts == ["multi\nline", "q2", "q3"]
    assert data.small[:2].tolist() == [3.0, 8.0] and np.isnan(data.small[2])
    assert data.large.tolist() == [9.0, 7.5, 5.0]
    assert data.small_name == "cheap"


def test_missing_column_names_column_and_line(tmp_path: Path) -> None:
    f = _csv(tmp_path / "bad.csv", "prompt,cheap\nq,1\n")
    with pytest.raises(DatasetError, match=r"bad.csv: line 1: missing column 'pricey'"):
        load_dataset(f, small="cheap", large="pricey")


def test_bad_value_names_line_and_column(tmp_path: Path) -> None:
    f = _csv(tmp_path / "bad.csv", 'prompt,s,l\nq1,1,0\n"two\nlines",1,0\nq3,maybe,1\n')
    with pytest.raises(DatasetError, match=r"line 5: column 's'.*'maybe'"):
        load_dataset(f, small="s", large="l")


def _trace(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_traces_read_outcomes_tokens_teams(tmp_path: Path) -> None:
    base = {"schema_version": 1, "time": 1.5, "team": "a", "prompt_tokens": 12}
    f = _trace(
        tmp_path / "t.jsonl",
        [
            {**base, "id": "1", "prompt": "hi", "outcomes": {"small": 0, "large": 1}},
            {
                **base,
                "id": "2",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "yo"}]}],
                "outcomes": {"small": 1, "large": 1},
                "source": "mmlu",
            },
        ],
    )
    data = load_dataset(f)
    assert data.prompts == ["hi", "yo"]
    assert data.small.tolist() == [0.0, 1.0] and data.large.tolist() == [1.0, 1.0]
    assert data.teams is not None and data.teams.tolist() == ["a", "a"]
    assert data.prompt_tokens is not None and data.prompt_tokens.tolist() == [12.0, 12.0]
    assert data.benchmark.tolist() == ["t", "mmlu"]
    assert data.ids == ["1", "2"] and data.subset(np.array([1])).ids == ["2"]


def test_trace_errors_name_field_and_line(tmp_path: Path) -> None:
    ok = {
        "schema_version": 1,
        "id": "1",
        "time": 1.0,
        "prompt": "p",
        "outcomes": {"small": 1, "large": 0},
    }
    f = _trace(tmp_path / "t.jsonl", [ok, {**ok, "outcomes": {"small": 1}}])
    with pytest.raises(DatasetError, match=r"t.jsonl: line 2: missing field 'outcomes.large'"):
        load_dataset(f)
    assert np.isnan(load_dataset(f, require_outcomes=False).large[1])
    f = _trace(tmp_path / "u.jsonl", [{k: v for k, v in ok.items() if k != "time"}])
    with pytest.raises(DatasetError, match=r"line 1: missing field 'time'"):
        load_dataset(f)
    f = _trace(tmp_path / "v.jsonl", [{**ok, "schema_version": 99}])
    with pytest.raises(DatasetError, match="schema_version 99"):
        load_dataset(f)
    f = _trace(tmp_path / "w.jsonl", [{k: v for k, v in ok.items() if k != "prompt"}])
    with pytest.raises(DatasetError, match=r"line 1: missing field 'prompt'"):
        load_dataset(f)
    (tmp_path / "x.jsonl").write_text('{"schema_version": 1, "id": "1", "time": 1}\n{oops\n')
    with pytest.raises(DatasetError, match=r"x.jsonl: line 2: not JSON"):
        load_dataset(tmp_path / "x.jsonl", require_outcomes=False)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "absent")


def test_a_folder_is_walked_in_time_order_without_feedback_or_contamination(
    tmp_path: Path,
) -> None:
    # A trace folder (current file, rotated ones, feedback) with a RouteLLM benchmark beside it.
    def record(n: int) -> dict:
        return {
            "schema_version": 1,
            "id": f"r{n}",
            "time": 100.0 - n,
            "prompt": f"p{n}",
            "outcomes": {"small": 0, "large": 1},
        }

    for n, suffix in ((0, ""), (1, ".1"), (2, ".2"), (10, ".10")):
        _trace(tmp_path / f"requests.jsonl{suffix}", [record(n)])
    (tmp_path / "feedback.jsonl").write_text('{"request_id": "r0", "score": 1.0, "time": 1}\n')
    (tmp_path / "gsm8k").mkdir()
    _csv(tmp_path / "gsm8k" / "q.csv", "prompt,small,large\nkept,0,1\nleaked,1,1\n")
    (tmp_path / "gsm8k" / "contaminated_prompts.jsonl").write_text('{"eval_prompt": "leaked"}\n')
    data = load_dataset(tmp_path, small="small", large="large")
    # Rotated files oldest first, numerically (.10 before .2), the current file last.
    assert data.ids == ["gsm8k/q.csv:1", "r10", "r2", "r1", "r0"]
    assert data.timestamps is not None and data.timestamps[1:].tolist() == [90, 98, 99, 100]
    assert [Path(f).name for f in data.files] == [
        "q.csv",
        "requests.jsonl.10",
        "requests.jsonl.2",
        "requests.jsonl.1",
        "requests.jsonl",
    ]
    assert data.excluded_contaminated == 1 and "leaked" not in data.prompts
    # A rotated file's rows are named for the trace, not for "requests.jsonl".
    assert data.source.tolist() == ["q", "requests", "requests", "requests", "requests"]
    assert data.benchmark.tolist() == ["gsm8k", "requests", "requests", "requests", "requests"]


def test_trace_folder_merges_labels_and_feedback_by_request_id(tmp_path: Path) -> None:
    """A proxy trace folder: the record's own outcomes, then feedback (the answering tier), then
    labels override per tier; side files are never read as traces; unlabelled rows are counted."""
    from trace_format.labels import LabelRecord

    def rec(i: int, **extra: object) -> dict:
        return {
            "schema_version": 1,
            "id": f"q{i}",
            "time": float(i),
            "prompt": f"prompt {i}",
            "tier": "small",
            **extra,
        }

    folder = tmp_path / "traces"
    folder.mkdir()
    _trace(
        folder / "requests.jsonl",
        [
            rec(0, outcomes={"small": 0.2, "large": 0.9}),  # an evaluation record: kept as is
            rec(1, outcomes={"large": 1.0}),  # feedback gives the small tier's outcome
            rec(2),  # labels give both
            rec(3),  # feedback only: one outcome, so unlabelled
            {k: v for k, v in rec(4).items() if k != "prompt"},  # labelled but no text logged
            rec(5),  # nothing
        ],
    )
    (folder / "feedback.jsonl").write_text(
        '{"request_id": "q1", "score": 0.25}\n{"request_id": "q2", "score": 0.0}\n'
        '{"request_id": "q3", "score": 1.0}\n{"request_id": "q1", "sco'
    )
    labels = [
        LabelRecord(request_id="q2", judge="llm", outcomes={"small": 0.5, "large": 0.75}),
        LabelRecord(request_id="q4", judge="llm", outcomes={"small": 1.0, "large": 1.0}),
        LabelRecord(request_id="q0", judge="reference", outcomes={"large": 0.5}),
    ]
    (folder / "labels.jsonl").write_bytes(b"".join(label.line() for label in labels) + b"{oops")
    (folder / "shadow.jsonl").write_text("not a trace\n")
    (folder / "shadow-2026-12-01.jsonl").write_text("not a trace either\n")

    data = load_dataset(folder, labelled_only=True)
    assert data.ids == ["q0", "q1", "q2"]
    assert data.small.tolist() == [0.2, 0.25, 0.5]
    assert data.large.tolist() == [0.5, 1.0, 0.75]
    assert (data.unlabelled, data.without_text, data.from_labels) == (2, 1, 3)
    assert data.first_unlabelled is not None and "line 4: missing field 'outcomes.large'" in (
        data.first_unlabelled
    )
    # Without labelled_only the first request without both outcomes is an error, as before.
    with pytest.raises(DatasetError, match=r"line 4: missing field 'outcomes.large'"):
        load_dataset(folder)
    # The trace file named directly reads the files beside it too.
    assert load_dataset(folder / "requests.jsonl", labelled_only=True).ids == ["q0", "q1", "q2"]
