"""trace_format/jsonl.py: the tolerant reader of files appended to while read (absent, torn,
foreign lines) and the incremental `Tail` (whole lines only; rotation read on, replacement and
truncation read again), with the readers built on them (labels, shadow records, oof scores)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from classifiers.oof import read_scores
from trace_format.jsonl import Tail, jsonl_lines, parse_object, read_objects
from trace_format.labels import LabelRecord, iter_labels, merged_outcomes
from trace_format.shadow import iter_shadow


def _line(**record: object) -> bytes:
    return orjson.dumps(record) + b"\n"


def test_absent_file_reads_as_empty(tmp_path: Path) -> None:
    assert list(read_objects(tmp_path / "absent.jsonl")) == []
    assert list(iter_labels(tmp_path / "absent.jsonl")) == []
    assert merged_outcomes(tmp_path / "absent.jsonl") == {}
    with pytest.raises(OSError):
        list(jsonl_lines(tmp_path / "absent.jsonl"))


def test_torn_blank_and_foreign_lines_are_passed_over(tmp_path: Path) -> None:
    path = tmp_path / "shadow.jsonl"
    path.write_bytes(
        _line(request_id="a")
        + b"\n"
        + b"[1, 2]\n"
        + b'"text"\n'
        + b"not json\n"
        + _line(request_id="b")
        + b'{"request_id": "c", "ti'  # the writer's append, cut short
    )
    assert [r["request_id"] for r in read_objects(path)] == ["a", "b"]
    assert [r["request_id"] for r in iter_shadow(path)] == ["a", "b"]
    lines = list(jsonl_lines(path))
    assert [line.number for line in lines] == list(range(1, 8))
    assert [line.blank for line in lines] == [False, True, False, False, False, False, False]
    assert lines[0].raw == _line(request_id="a") and lines[-1].value is None
    assert parse_object(b"{}") == {} and parse_object(b"1") is None


def test_a_complete_last_line_without_its_newline_is_read(tmp_path: Path) -> None:
    # Files written by hand often lack the final newline; an object cut short never parses.
    path = tmp_path / "labels.jsonl"
    label = LabelRecord(request_id="r1", judge="llm", outcomes={"small": 1.0})
    path.write_bytes(label.line() + b'{"request_id": "r2"}')
    assert [r["request_id"] for r in read_objects(path)] == ["r1", "r2"]
    # The second object is not a label: skipped by the label reader.
    assert [lb.request_id for lb in iter_labels(path)] == ["r1"]


def test_oof_scores_still_refuse_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "m.oof.jsonl"
    path.write_bytes(_line(request_id="a", score=0.5) + b"\n" + _line(request_id=7, score=1))
    assert read_scores(path) == {"a": 0.5, "7": 1.0}
    with open(path, "ab") as fh:
        fh.write(b'{"request_id": "b", "sco')
    with pytest.raises(ValueError, match=r"m\.oof\.jsonl: line 4: expected an object"):
        read_scores(path)
    with pytest.raises(ValueError, match="cannot read scores"):
        read_scores(tmp_path / "absent.oof.jsonl")


def test_tail_reads_whole_lines_once(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    tail = Tail([path])
    assert list(tail.lines()) == []  # absent: nothing, and no error
    path.write_bytes(b"one\ntw")
    assert list(tail.lines()) == [b"one"]
    assert list(tail.lines()) == []  # the half-written line waits
    with open(path, "ab") as fh:
        fh.write(b"o\n\nthree\n")
    assert list(tail.lines()) == [b"two", b"", b"three"]
    assert list(tail.lines()) == []


def test_tail_reads_a_replaced_or_truncated_file_again(tmp_path: Path) -> None:
    path = tmp_path / "shadow.jsonl"
    path.write_bytes(b"a\nb\nc\n")
    tail = Tail([path])
    assert list(tail.lines()) == [b"a", b"b", b"c"]
    # Pruning writes a new file and swaps it in: a new inode, read from its start.
    tmp = tmp_path / "shadow.jsonl.tmp"
    tmp.write_bytes(b"b\nc\nd\n")
    os.replace(tmp, path)
    assert list(tail.lines()) == [b"b", b"c", b"d"]
    # Truncated in place: shorter than what was read, so read again.
    path.write_bytes(b"e\n")
    assert list(tail.lines()) == [b"e"]


def test_tail_reads_a_rotated_file_on_from_where_it_was(tmp_path: Path) -> None:
    current = tmp_path / "requests.jsonl"
    rotated = tmp_path / "requests.jsonl.1"
    tail = Tail([rotated, current])
    current.write_bytes(b"r1\nr2\n")
    assert list(tail.lines()) == [b"r1", b"r2"]
    with open(current, "ab") as fh:
        fh.write(b"r3\n")
    current.rename(rotated)  # rotation: the current file keeps its inode under the new name
    current.write_bytes(b"r4\n")
    assert list(tail.lines()) == [b"r3", b"r4"]
    assert list(tail.lines()) == []


def test_tail_catches_up_a_backlog_over_several_calls(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_bytes(b"".join(b"line%d\n" % i for i in range(10)))
    tail = Tail([path], max_read=16)
    got: list[bytes] = []
    for _ in range(10):
        got += tail.lines()
    assert got == [b"line%d" % i for i in range(10)]
