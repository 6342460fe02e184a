"""trace_format/: the one trace reader (version check, errors naming file and line), the
trace-folder layout, the feedback file, and the request text every area reads."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from trace_format.feedback import FEEDBACK_FILE, feedback_line, feedback_path_for, load_feedback
from trace_format.reader import (
    TraceFormatError,
    data_files,
    is_trace_file,
    iter_lines,
    iter_records,
    parse_line,
    trace_files,
    trace_stem,
)
from trace_format.request_text import request_text, upstream_text
from trace_format.routellm_csv import CONTAMINATION_FILE
from trace_format.schema import SCHEMA_VERSION


def _write(path: Path, *lines: bytes) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _rec(**extra: object) -> bytes:
    return orjson.dumps({"schema_version": SCHEMA_VERSION, "id": "r1", "time": 1.0, **extra})


def test_records_are_validated_and_blank_lines_skipped(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", _rec(tier="small", score=0.25), b"", _rec(id="r2"))
    records = [r for _, r in iter_records(path)]
    assert [r.id for r in records] == ["r1", "r2"]
    assert records[0].tier == "small" and records[0].score == 0.25


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{not json", "line 2: not JSON"),
        (b"[1, 2]", "line 2: expected a JSON object"),
        (
            orjson.dumps({"schema_version": 99, "id": "x", "time": 1}),
            "line 2: trace schema_version 99 is not supported",
        ),
        (orjson.dumps({"schema_version": 1, "time": 1}), "line 2: missing field 'id'"),
        (_rec(score=7), "line 2: field 'score'"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, line: bytes, message: str) -> None:
    path = _write(tmp_path / "t.jsonl", _rec(), line)
    with pytest.raises(TraceFormatError, match=message) as err:
        list(iter_records(path))
    assert str(path) in str(err.value)


def test_contains_prefilter_skips_lines_unparsed(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", _rec(experiment="a"), b"{garbage", _rec(experiment="b"))
    assert [d["experiment"] for _, d in iter_lines(path, contains=b'"a"')] == ["a"]


def test_python_json_lines_load_nan_and_invalid_utf8(tmp_path: Path) -> None:
    # json.dumps writes NaN for a NaN outcome; orjson rejects it, as it does invalid UTF-8.
    line = b'{"schema_version": 1, "id": "r\xff", "time": 1.0, "outcomes": {"small": NaN}}'
    data = parse_line(line, "t.jsonl: line 1")
    assert data["id"] == "r\ufffd" and data["outcomes"]["small"] != data["outcomes"]["small"]
    path = _write(tmp_path / "t.jsonl", line, b'{"schema_version": 1, "id": "x", "time": Infinity}')
    assert [r.time for _, r in iter_records(path)][1] == float("inf")
    with pytest.raises(TraceFormatError, match="line 1: not JSON"):
        parse_line(b"{NaN: 1}", "line 1")


def test_trace_folder_holds_current_and_rotated_files_oldest_first_not_feedback(
    tmp_path: Path,
) -> None:
    (tmp_path / "sub").mkdir()
    for name in (
        "requests.jsonl",
        "requests.jsonl.1",
        "requests.jsonl.2",
        "requests.jsonl.10",
        FEEDBACK_FILE,
        CONTAMINATION_FILE,
        "notes.txt",
        "sub/other.jsonl",
    ):
        (tmp_path / name).write_text("")
    names = [p.name for p in trace_files([tmp_path])]
    # Oldest first (numeric: .10 is older than .2); the folder's own files, not sub/'s.
    assert names == ["requests.jsonl.10", "requests.jsonl.2", "requests.jsonl.1", "requests.jsonl"]
    with pytest.raises(TraceFormatError, match="not found"):
        trace_files([tmp_path / "missing.jsonl"])


def test_data_files_walks_a_folder_in_time_order(tmp_path: Path) -> None:
    for name in (
        "a/requests.jsonl",
        "a/requests.jsonl.1",
        "a/requests.jsonl.10",
        "a/requests.jsonl.2",
        f"a/{FEEDBACK_FILE}",
        f"b/{CONTAMINATION_FILE}",
        "b/responses/q.csv",
        "b/notes.txt",
        "b/data.parquet",
        "a.csv",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    got = [p.relative_to(tmp_path).as_posix() for p in data_files(tmp_path)]
    assert got == [
        "a/requests.jsonl.10",
        "a/requests.jsonl.2",
        "a/requests.jsonl.1",
        "a/requests.jsonl",
        "a.csv",
        "b/responses/q.csv",
    ]  # by path parts, as Path sorts
    assert data_files(tmp_path / "b" / "notes.txt") == [tmp_path / "b" / "notes.txt"]  # as given
    with pytest.raises(TraceFormatError, match="not found"):
        data_files(tmp_path / "absent")
    assert [trace_stem(Path(n)) for n in ("requests.jsonl", "requests.jsonl.3", "q.csv")] == [
        "requests",
        "requests",
        "q",
    ]


def test_missing_trace_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read trace"):
        list(iter_lines(tmp_path / "absent.jsonl"))


def test_feedback_file_round_trip_averages_and_skips_torn_lines(tmp_path: Path) -> None:
    path = feedback_path_for(tmp_path / "requests.jsonl")
    assert path == tmp_path / FEEDBACK_FILE
    lines = [
        feedback_line(rid, score, None, now=1.0)[1]
        for rid, score in (("a", 1.0), ("a", 0.5), ("b", 0.0))
    ]
    path.write_bytes(b"".join(lines) + b'{"request_id": "c", "sco')
    assert load_feedback(path) == {"a": 0.75, "b": 0.0}
    assert load_feedback(tmp_path / "absent.jsonl") == {}


def test_request_text_and_upstream_text_read_both_body_kinds() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hello"},
                    {"type": "image_url", "image_url": {}},
                ],
            },
        ]
    }
    assert request_text(chat, context_turns=0) == "hello"
    assert request_text(chat, context_turns=2) == "be brief\nhello"
    assert upstream_text(chat) == "be brief\nhello"
    assert request_text({"prompt": ["a", "b"]}) == upstream_text({"prompt": ["a", "b"]}) == "a\nb"
    assert upstream_text({"prompt": [1, 2, 3]}) == ""


def test_side_files_beside_the_traces_are_not_traces(tmp_path: Path) -> None:
    # A proxy trace folder: feedback, the judges' labels and shadow answers sit beside the traces.
    for name in (
        "requests.jsonl.1",
        "requests.jsonl",
        "feedback.jsonl",
        "labels.jsonl",
        "shadow.jsonl",
        "shadow.jsonl.1",
        "shadow-2026-12-01.jsonl",
    ):
        (tmp_path / name).write_text("{}\n")
    assert [p.name for p in data_files(tmp_path)] == ["requests.jsonl.1", "requests.jsonl"]
    assert not is_trace_file(tmp_path / "labels.jsonl")
    assert is_trace_file(tmp_path / "eval-labels.jsonl")  # only the exact names are side files
