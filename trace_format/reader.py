"""The one reader of trace files (JSONL, one TraceRecord per line) with the one version check.

Training, the policies' reference traces, the simulator, the A/B report and the feedback id index
all read traces through here, so a schema change is handled in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from trace_format.feedback import FEEDBACK_FILE
from trace_format.schema import SUPPORTED_VERSIONS, TraceRecord

REQUIRED_FIELDS = ("schema_version", "id", "time")


class TraceFormatError(ValueError):
    """A trace that cannot be read; the message names the file and the line."""


def parse_line(raw: bytes, where: str) -> dict[str, Any]:
    """One trace line as a dict, after the version check (fields are not validated)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TraceFormatError(f"{where}: expected a JSON object")
    version = data.get("schema_version", 1)
    if version not in SUPPORTED_VERSIONS:
        raise TraceFormatError(
            f"{where}: trace schema_version {version!r} is not supported "
            f"(this reader knows {sorted(SUPPORTED_VERSIONS)})"
        )
    return data


def iter_lines(
    path: str | Path, contains: bytes | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, dict) per non-empty line; `contains` skips lines without those bytes unparsed."""
    p = Path(path)
    try:
        handle = p.open("rb")
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace {p}: {exc.strerror}") from None
    with handle:
        for line_no, raw in enumerate(handle, 1):
            if not raw.strip() or (contains is not None and contains not in raw):
                continue
            yield f"{p}: line {line_no}", parse_line(raw, f"{p}: line {line_no}")


def validate(data: dict[str, Any], where: str) -> TraceRecord:
    """A parsed line as a TraceRecord; the error names the field."""
    for key in REQUIRED_FIELDS:
        if key not in data:
            raise TraceFormatError(f"{where}: missing field {key!r}")
    try:
        return TraceRecord.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise TraceFormatError(f"{where}: field {loc!r}: {err['msg']}") from None


def iter_records(path: str | Path) -> Iterator[tuple[str, TraceRecord]]:
    """(where, record) per line of one trace file, validated."""
    for where, data in iter_lines(path):
        yield where, validate(data, where)


def is_trace_file(path: Path) -> bool:
    """A trace file of a trace folder: `*.jsonl` or a rotated `*.jsonl.N`, not the feedback file."""
    name = path.name
    if name == FEEDBACK_FILE:
        return False
    stem, _, n = name.rpartition(".jsonl.")
    return name.endswith(".jsonl") or (bool(stem) and n.isdigit())


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Each path given, or every trace file in a folder (rotated ones included), sorted."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.is_file() and is_trace_file(f))
        elif p.exists():
            files.append(p)
        else:
            raise TraceFormatError(f"trace file not found: {p}")
    return files
