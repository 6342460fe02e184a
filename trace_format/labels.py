"""The label file: one JSON object per line beside the traces, written by the judges.

A label says how good each tier's answer to one request was, in the trace's own terms:
``outcomes`` = {tier name: quality in [0, 1]}, the same field offline traces carry. Training and
the simulator merge labels into the trace records by request id, so a labelled trace folder reads
like an evaluation trace. Each label names the judge that produced it, the judge's version (the
prompt file's hash for the `llm` judge) and what judging cost, so labels of different judges or
judge versions can be told apart and weighed.

Version 1 fields: ``schema_version``, ``request_id``, ``judge`` (``llm``, ``reference``,
``feedback``, or ``import``: offline grades, `cost-router grades import`, version = the grades
file's hash), ``judge_version``, ``outcomes``, ``cost_usd`` (judge spend, >= 0), ``time``;
optional ``verdict`` (the judge's own words: ``A``, ``B``, ``tie``, a grade) and ``detail``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict, Field

from trace_format.jsonl import read_objects

LABELS_FILE = "labels.jsonl"
LABEL_SCHEMA_VERSION = 1


class LabelRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    schema_version: int = LABEL_SCHEMA_VERSION
    request_id: str
    judge: str
    judge_version: str = ""
    outcomes: dict[str, float]
    cost_usd: float = Field(default=0.0, ge=0)
    time: float = Field(default_factory=time.time)
    verdict: str | None = None
    detail: str | None = None

    def line(self) -> bytes:
        return orjson.dumps(self.model_dump(exclude_none=True)) + b"\n"


def labels_path_for(trace_path: str | Path) -> Path:
    """Where labels for the traces at `trace_path` are kept."""
    return Path(trace_path).parent / LABELS_FILE


def append_labels(path: Path, records: Iterable[LabelRecord]) -> None:
    """Append label lines; a half-written last line (a writer that died mid-line) must not
    swallow the first new label, so they start on a line of their own."""
    data = b"".join(r.line() for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab+") as fh:
        fh.seek(0, 2)
        torn = False
        if fh.tell():
            fh.seek(-1, 2)
            torn = fh.read(1) != b"\n"
        fh.write((b"\n" if torn else b"") + data)


def iter_labels(path: str | Path) -> Iterator[LabelRecord]:
    """Every label of a label file, in file order (none if the file is absent). The file is
    appended to while the proxy runs (trace_format/jsonl.py); lines that are not labels are
    skipped."""
    for record in read_objects(path):
        try:
            yield LabelRecord.model_validate(record)
        except ValueError:
            continue


def merged_outcomes(path: str | Path) -> dict[str, dict[str, float]]:
    """Outcomes per request id, later labels of a tier overriding earlier ones."""
    out: dict[str, dict[str, float]] = {}
    for rec in iter_labels(path):
        out.setdefault(rec.request_id, {}).update(rec.outcomes)
    return out
