"""Importing offline grades as labels (`cost-router grades import`, docs/simulator.md).

A team that graded answers offline (a benchmark's checker, human raters, an eval harness) gives
a JSONL file, one object per graded request:

- ``{"request_id": "...", "outcomes": {"small": 1, "large": 0.5}}``: each tier's quality in
  [0, 1] (a tier's answer graded whether or not the proxy sent it there), or
- ``{"request_id": "...", "score": 0.8}``: per-request feedback in bulk, the quality of the
  answer the client got, so the outcome of the tier that answered (as `POST /v1/feedback` is).

Each becomes a label (trace_format/labels.py) beside the trace that holds the request, judge
``import`` with the grades file's content hash as its version, so `tune`, `simulate`,
`what-if` and `classifier train` read it as they read the judges' labels (a later label of a
tier overrides an earlier one: importing again, or a corrected file, wins). Nothing is written
unless the whole file is good: a line that is not a grade, a quality outside [0, 1], or a request
id the traces do not hold is an error naming the line.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_format.jsonl import jsonl_lines
from trace_format.labels import LabelRecord, append_labels, labels_path_for
from trace_format.reader import TraceFormatError, data_files, is_trace_file, iter_lines

IMPORT_JUDGE = "import"


class GradesError(ValueError):
    """A grades file that cannot be imported; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Grade:
    where: str
    request_id: str
    outcomes: dict[str, float] | None  # per tier
    score: float | None  # the answered tier's quality


@dataclass(frozen=True)
class ImportResult:
    grades: int
    from_scores: int  # grades given as a score, on the tier that answered
    per_tier: dict[str, int]
    label_files: list[Path]
    judge_version: str
    tiers_equal: int = 0  # grades whose every tier has the same quality
    multi_tier: int = 0  # grades with two tiers or more
    unseen_tiers: tuple[str, ...] = ()  # graded tiers no record of the traces names (a typo?)


def _quality(value: Any, where: str, name: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        raise GradesError(f"{where}: {name} must be a quality in [0, 1], got {value!r}")
    return float(value)


def _grade(value: dict[str, Any], where: str) -> Grade:
    rid = value.get("request_id")
    if not isinstance(rid, str) or not rid:
        raise GradesError(f"{where}: missing field 'request_id'")
    outcomes, score = value.get("outcomes"), value.get("score")
    if (outcomes is None) == (score is None):
        raise GradesError(f"{where}: give exactly one of 'outcomes' ({{tier: quality}}) or 'score'")
    if score is not None:
        return Grade(where, rid, None, _quality(score, where, "'score'"))
    if not isinstance(outcomes, dict) or not outcomes:
        raise GradesError(f"{where}: 'outcomes' must map tier names to qualities")
    parsed = {str(t): _quality(q, where, f"'outcomes.{t}'") for t, q in outcomes.items()}
    return Grade(where, rid, parsed, None)


def read_grades(path: str | Path) -> list[Grade]:
    """Every grade of a grades file, checked; blank lines skipped."""
    p = Path(path)
    grades = []
    try:
        for line in jsonl_lines(p):
            if line.blank:
                continue
            where = f"{p}: line {line.number}"
            if line.value is None:
                raise GradesError(f"{where}: not a JSON object")
            grades.append(_grade(line.value, where))
    except OSError as exc:
        raise GradesError(f"cannot read grades {p}: {exc.strerror}") from None
    if not grades:
        raise GradesError(f"{p}: no grades")
    return grades


@dataclass(frozen=True, slots=True)
class _Served:
    folder: Path  # where the request's trace is, so where its label goes
    tier: str | None  # the tier that answered (None: none did)


def _requests(traces: Path, wanted: set[str]) -> tuple[dict[str, _Served], set[str]]:
    """The wanted requests found, and every tier the traces name."""
    files = [f for f in data_files(traces) if is_trace_file(f)]
    if not files:
        raise GradesError(f"{traces}: no trace files (*.jsonl) to import grades into")
    found: dict[str, _Served] = {}
    tiers: set[str] = set()
    for file in files:
        for _, data in iter_lines(file):
            named = [data.get("tier"), *(data.get("tiers_tried") or [])]
            tiers.update(t for t in named if isinstance(t, str))
            rid = data.get("id")
            if rid in wanted:
                tried = data.get("tiers_tried") or []
                tier = tried[-1] if tried else data.get("tier")
                ok = data.get("status") in (None, 200)
                found[rid] = _Served(file.parent, tier if ok and isinstance(tier, str) else None)
    return found, tiers


def import_grades(
    grades_path: str | Path, traces: str | Path, tiers: Collection[str] | None = None
) -> ImportResult:
    """Check every grade of `grades_path` against the trace folder (or file) `traces` (and, given
    `tiers`, the config's tier names), then write them as labels beside the traces holding the
    requests; GradesError before writing anything if a grade is bad, names a request the traces
    do not hold or a tier not in `tiers`."""
    grades = read_grades(grades_path)
    if tiers is not None:
        for g in grades:
            unknown = sorted(set(g.outcomes or {}) - set(tiers))
            if unknown:
                raise GradesError(
                    f"{g.where}: tier {unknown[0]!r} is not in the config's tiers "
                    f"({', '.join(tiers)}); nothing imported"
                )
    version = hashlib.sha256(Path(grades_path).read_bytes()).hexdigest()[:12]
    try:
        served, seen = _requests(Path(traces), {g.request_id for g in grades})
    except TraceFormatError as exc:
        raise GradesError(str(exc)) from None
    missing = [g for g in grades if g.request_id not in served]
    if missing:
        raise GradesError(
            f"{missing[0].where}: request {missing[0].request_id!r} is not in the traces at "
            f"{traces} ({len(missing)} of {len(grades)} grades name requests the traces do not "
            "hold; nothing imported)"
        )
    by_folder: dict[Path, list[LabelRecord]] = {}
    per_tier: dict[str, int] = {}
    equal = multi = 0
    for g in grades:
        where = served[g.request_id]
        if g.outcomes is not None:
            outcomes = g.outcomes
        elif where.tier is None:
            raise GradesError(
                f"{g.where}: request {g.request_id!r} was not answered by a tier, so its 'score' "
                "has no tier to grade (give 'outcomes' per tier; nothing imported)"
            )
        else:
            outcomes = {where.tier: float(g.score or 0.0)}
        for t in outcomes:
            per_tier[t] = per_tier.get(t, 0) + 1
        if len(outcomes) > 1:
            multi += 1
            equal += len(set(outcomes.values())) == 1
        by_folder.setdefault(where.folder, []).append(
            LabelRecord(
                request_id=g.request_id,
                judge=IMPORT_JUDGE,
                judge_version=version,
                outcomes=outcomes,
                detail=f"imported from {Path(grades_path).name}",
            )
        )
    files = []
    for folder, records in by_folder.items():
        path = labels_path_for(folder / "requests.jsonl")
        append_labels(path, records)
        files.append(path)
    return ImportResult(
        grades=len(grades),
        from_scores=sum(g.score is not None for g in grades),
        per_tier=dict(sorted(per_tier.items())),
        label_files=files,
        judge_version=version,
        tiers_equal=equal,
        multi_tier=multi,
        unseen_tiers=tuple(sorted(set(per_tier) - seen)),
    )
