"""Offline grades imported as labels (issue 25, item 6): with echo upstreams the reference judge
labels both tiers 0, and `tune` said `no threshold meets quality >= 95.0% ... the best is 0.0%`.
Now it says the labels cannot tell the tiers apart, and `cost-router grades import` turns a
team's own grades (real GSM8K outcomes here) into labels every offline command reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from router.cli import app
from tests.support.sim import router_config_dict, write_jsonl_trace
from trace_format.labels import LabelRecord, iter_labels

runner = CliRunner()
N = 120


def _cli(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A proxy trace folder without outcomes, each request labelled 0/0 by the reference judge
    (what an echo upstream's answers get), and the true outcomes kept aside."""
    out = tmp_path / "traces"
    out.mkdir()
    records = write_jsonl_trace(tmp_path / "graded.jsonl", N)
    served = []
    for r in records:
        row = {k: v for k, v in r.items() if k != "outcomes"}
        row.update(tier="small", status=200)
        served.append(row)
    (out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in served))
    zeros = [
        LabelRecord(request_id=r["id"], judge="reference", outcomes={"small": 0.0, "large": 0.0})
        for r in records
    ]
    (out / "labels.jsonl").write_bytes(b"".join(z.line() for z in zeros))
    return out, records


def _tune(folder: Path, *extra: str) -> tuple[int, str]:
    return _cli("tune", "-t", str(folder), "--bootstrap", "0", *extra)


def test_tune_says_the_labels_cannot_tell_the_tiers_apart(folder: tuple[Path, Any]) -> None:
    code, out = _tune(folder[0], "--target-quality", "0.95")
    assert code == 2
    assert "the labels cannot tell the tiers apart" in out
    assert f"on all {N} labelled requests" in out and "(all 0)" in out
    assert "the best is 0.0%" not in out
    # A share target still tunes, and says what the quality column is worth.
    code, out = _tune(folder[0], "--max-large-share", "0.3")
    assert code == 0, out
    assert "note: the labels cannot tell the tiers apart" in out


def test_imported_grades_are_the_labels_tune_reads(
    folder: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    traces, records = folder
    grades = tmp_path / "grades.jsonl"
    grades.write_text(
        "".join(
            json.dumps({"request_id": r["id"], "outcomes": r["outcomes"]}) + "\n" for r in records
        )
    )
    code, out = _cli("grades", "import", str(grades), "--traces", str(traces))
    assert code == 0, out
    assert f"imported {N} grades as judge 'import'" in out and f"large {N}, small {N}" in out
    imported = [lab for lab in iter_labels(traces / "labels.jsonl") if lab.judge == "import"]
    assert len(imported) == N
    code, out = _tune(traces, "--target-quality", "0.95", "--json", str(tmp_path / "t.json"))
    assert code == 0, out
    result = json.loads((tmp_path / "t.json").read_text())
    assert result["quality_ratio"] >= 0.95 and result["labels_note"] is None
    large = sum(r["outcomes"]["large"] for r in records) / N
    assert result["all_large"]["quality"] == pytest.approx(large)


def test_bulk_feedback_grades_the_tier_that_answered(
    folder: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    traces, records = folder
    grades = tmp_path / "scores.jsonl"
    grades.write_text(json.dumps({"request_id": records[0]["id"], "score": 0.75}) + "\n")
    code, out = _cli("grades", "import", str(grades), "--traces", str(traces))
    assert code == 0, out
    assert "1 from a score, on the tier that answered" in out
    last = list(iter_labels(traces / "labels.jsonl"))[-1]
    assert last.request_id == records[0]["id"] and last.outcomes == {"small": 0.75}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            {"request_id": "nobody", "outcomes": {"small": 1}},
            "request 'nobody' is not in the traces",
        ),
        ({"request_id": "req-1", "outcomes": {"small": 2}}, "'outcomes.small' must be a quality"),
        ({"request_id": "req-1"}, "give exactly one of 'outcomes'"),
        ({"outcomes": {"small": 1}}, "missing field 'request_id'"),
    ],
)
def test_a_bad_grade_imports_nothing_and_names_the_line(
    folder: tuple[Path, Any], tmp_path: Path, line: dict[str, Any], message: str
) -> None:
    traces = folder[0]
    before = (traces / "labels.jsonl").read_bytes()
    grades = tmp_path / "bad.jsonl"
    good = {"request_id": "req-0", "outcomes": {"small": 1, "large": 1}}
    grades.write_text(json.dumps(good) + "\n" + json.dumps(line) + "\n")
    code, out = _cli("grades", "import", str(grades), "--traces", str(traces))
    assert code == 2
    assert f"{grades}: line 2: " in out and message in out
    assert (traces / "labels.jsonl").read_bytes() == before


def test_with_the_config_a_tier_it_does_not_have_is_refused(
    folder: tuple[Path, Any], tmp_path: Path
) -> None:
    traces = folder[0]
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump(router_config_dict()))
    grades = tmp_path / "typo.jsonl"
    grades.write_text(json.dumps({"request_id": "req-0", "outcomes": {"small": 1, "larg": 1}}))
    before = (traces / "labels.jsonl").read_bytes()
    code, out = _cli("grades", "import", str(grades), "-t", str(traces), "-c", str(config))
    assert code == 2 and "line 1: tier 'larg' is not in the config's tiers" in out
    assert (traces / "labels.jsonl").read_bytes() == before
    # Without the config, the import says no request went to that tier.
    code, out = _cli("grades", "import", str(grades), "-t", str(traces))
    assert code == 0 and "no request in the traces was sent to larg;" in out
