"""The RouteLLM CSV format (trace_format/routellm_csv.py): rows, outcomes, errors naming file and
line, contamination files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trace_format.routellm_csv import CsvFormatError, iter_rows, parse_outcome


def test_outcomes_parse() -> None:
    assert [parse_outcome(v, "x") for v in ("True", " f ", "YES", "1", "0", "7.5", True)] == [
        1.0,
        0.0,
        1.0,
        1.0,
        0.0,
        7.5,
        1.0,
    ]
    assert math.isnan(parse_outcome("", "x")) and math.isnan(parse_outcome(None, "x"))
    with pytest.raises(CsvFormatError, match=r"f.csv: line 3: .*'maybe'"):
        parse_outcome("maybe", "f.csv: line 3")


def test_rows_carry_ids_locations_and_answers(tmp_path: Path) -> None:
    path = tmp_path / "judge.csv"
    path.write_text('prompt,s,l,l_response\n"two\nlines",1,8,ok\n\nq2,,false,\n')
    rows = list(iter_rows(path, "s", "l"))
    assert [(r.id, r.where, r.prompt) for r in rows] == [
        ("judge.csv:1", f"{path}: line 2", "two\nlines"),
        ("judge.csv:2", f"{path}: line 5", "q2"),
    ]
    assert (rows[0].small, rows[0].large, rows[0].large_response) == (1.0, 8.0, "ok")
    assert math.isnan(rows[1].small) and rows[1].large == 0.0 and rows[1].large_response == ""
    assert rows[0].small_response is None  # no `s_response` column


def test_errors_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("prompt,s\nq,1\n")
    with pytest.raises(CsvFormatError, match=r"bad.csv: line 1: missing column 'l'"):
        list(iter_rows(path, "s", "l"))
    path.write_text('prompt,s,l\nq1,1,0\n"two\nlines",1,0\nq3,maybe,1\nq4,1\n')
    with pytest.raises(CsvFormatError, match=r"bad.csv: line 5: column 's'.*'maybe'"):
        list(iter_rows(path, "s", "l"))
    path.write_text("prompt,s,l\nq4,1\n")
    with pytest.raises(CsvFormatError, match=r"bad.csv: line 2: 2 fields, header has 3"):
        list(iter_rows(path, "s", "l"))
    path.write_text("")
    with pytest.raises(CsvFormatError, match=r"bad.csv: line 1: empty file"):
        list(iter_rows(path, "s", "l"))


def test_contaminated_prompts_are_flagged_from_the_file_beside_or_above(tmp_path: Path) -> None:
    folder = tmp_path / "mmlu" / "responses"
    folder.mkdir(parents=True)
    path = folder / "mmlu.csv"
    path.write_text("prompt,s,l\nclean,1,0\nleaked,bad,0\n")
    (tmp_path / "mmlu" / "contaminated_prompts.jsonl").write_text(
        json.dumps({"eval_prompt": "leaked"}) + "\n"
    )
    rows = list(iter_rows(path, "s", "l", root=tmp_path))  # found one folder up, outcome unparsed
    assert [(r.id, r.contaminated) for r in rows] == [
        ("mmlu/responses/mmlu.csv:1", False),
        ("mmlu/responses/mmlu.csv:2", True),
    ]
    with pytest.raises(CsvFormatError, match="column 's'"):
        list(iter_rows(path, "s", "l", root=tmp_path, exclude_contaminated=False))
    (tmp_path / "mmlu" / "contaminated_prompts.jsonl").write_text("{oops\n")
    with pytest.raises(CsvFormatError, match=r"contaminated_prompts.jsonl:1: expected JSON"):
        list(iter_rows(path, "s", "l", root=tmp_path))
