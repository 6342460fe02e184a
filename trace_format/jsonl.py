"""JSONL files that are appended to while they are read: the one tolerant reader
(`read_objects`, and `jsonl_lines` for callers that need each line) and the one incremental
reader (`Tail`). Traces themselves are read by trace_format/reader.py, which checks their schema.

Labels, feedback and shadow records (labels.py, feedback.py, shadow.py here), the shadow file's
pruning (router/learning/shadow_log.py), out-of-fold scores (classifiers/oof.py), the budget
journal (policies/budgets/journal.py), the trace id index and the live quality gauges
(router/observability) read through here. It is beside reader.py rather than in it because
reader.py knows the names of the files kept beside the traces (labels.py, feedback.py), and those
modules read through this one.

Tolerance: an absent file reads as an empty one, and a line that is not a JSON object is passed
over; a half-written last line is one of those, since an object cut short never parses, so a
writer's unfinished append is never read as a record. `Tail` goes further and consumes whole
lines only, so the rest of a half-written line is read once it is complete. Callers that must
not pass over anything (the journal, the scores a threshold is tuned on) take `jsonl_lines` and
decide for themselves.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson


def parse_object(raw: bytes) -> dict[str, Any] | None:
    """The JSON object a line holds; None for a blank or torn line, or other JSON."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, slots=True)
class JsonLine:
    number: int  # from 1
    raw: bytes  # as in the file, with its newline (the last line may have none)
    value: dict[str, Any] | None  # `parse_object(raw)`

    @property
    def blank(self) -> bool:
        return not self.raw.strip()


def jsonl_lines(path: str | Path) -> Iterator[JsonLine]:
    """Every line of a file, parsed, in order; OSError if the file cannot be opened."""
    with Path(path).open("rb") as fh:
        for number, raw in enumerate(fh, 1):
            yield JsonLine(number, raw, parse_object(raw))


def read_objects(path: str | Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a file that is appended to while we read, in file order: none if the
    file is absent; lines that are not JSON objects (a half-written last line) passed over."""
    p = Path(path)
    if not p.exists():
        return
    for line in jsonl_lines(p):
        if line.value is not None:
            yield line.value


class Tail:
    """New whole lines of files that are appended to, from where the last `lines()` stopped.

    A file is known by its device and inode, so one renamed by rotation (`requests.jsonl` to
    `requests.jsonl.1`) is read on from where it was. A file replaced (pruning writes a new one;
    rotation starts one) or truncated is read again from its start: readers dedupe by id."""

    def __init__(self, paths: Sequence[Path], max_read: int | None = None) -> None:
        self.paths = list(paths)
        self.max_read = max_read  # bytes per file per call: a backlog is caught up over calls
        # The file each path last was, as (device, inode), and the bytes of it consumed.
        self._read: dict[Path, tuple[tuple[int, int], int]] = {}

    def lines(self) -> Iterator[bytes]:
        """The lines completed since the last call, path by path (blocking I/O). One file's
        new bytes are in memory at a time."""
        for path in self.paths:
            yield from self._new_lines(path)

    def _new_lines(self, path: Path) -> list[bytes]:
        try:
            fh = path.open("rb")
        except OSError:
            return []
        with fh:
            st = os.fstat(fh.fileno())
            identity = (st.st_dev, st.st_ino)
            start = self._offset(path, identity)
            if st.st_size < start:
                start = 0
            fh.seek(start)
            data = fh.read(-1 if self.max_read is None else self.max_read)
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next call
        self._read[path] = (identity, start + end)
        return data[: end - 1].split(b"\n") if end else []

    def _offset(self, path: Path, identity: tuple[int, int]) -> int:
        known = self._read.get(path)
        if known is not None and known[0] == identity:
            return known[1]
        # Rotated: the file this path names now was read under another name.
        return next((done for seen, done in self._read.values() if seen == identity), 0)
