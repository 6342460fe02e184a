"""Request ids present in the trace files, with the team that made each request, read
incrementally (for POST /v1/feedback, which only the requesting team may send).

Reads the current and rotated trace files from where the last look-up stopped (a rotated file
from where it was read under its old name: trace_format/jsonl.py's `Tail`). Up to `max_ids` ids
are kept; the oldest are forgotten first.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from trace_format.jsonl import Tail
from trace_format.reader import TraceFormatError, parse_line


class TraceIdIndex:
    """Request id -> the team that made the request (None: no team known), read incrementally."""

    def __init__(self, trace_path: str | Path, backups: int, max_ids: int = 2_000_000) -> None:
        self.trace_path = Path(trace_path)
        self.backups = backups
        self.max_ids = max_ids
        self._ids: dict[str, str | None] = {}
        self._teams: dict[str, str] = {}  # one string object per team, not one per id
        self._tail = Tail(list(self._files()))
        self._lock = threading.Lock()

    def add(self, request_id: str, team: str | None = None) -> None:
        if team is not None and len(self._teams) < 100_000:
            team = self._teams.setdefault(team, team)
        self._ids[request_id] = team
        if len(self._ids) > self.max_ids:
            # dicts keep insertion order: drop the oldest half in one go.
            for stale in list(self._ids)[: self.max_ids // 2]:
                del self._ids[stale]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._ids

    def team(self, request_id: str) -> str | None:
        """The requesting team of a known id (None when unknown or recorded without one)."""
        return self._ids.get(request_id)

    def _files(self) -> Iterator[Path]:
        # Oldest first, so ids are added in time order.
        for n in range(self.backups, 0, -1):
            yield self.trace_path.with_name(f"{self.trace_path.name}.{n}")
        yield self.trace_path

    def refresh(self) -> None:
        """Read trace lines written since the last refresh (blocking; run it in a thread)."""
        with self._lock:
            for line in self._tail.lines():
                try:
                    record = parse_line(line, str(self.trace_path))
                except TraceFormatError:
                    continue  # a line another writer is rewriting, or a newer schema: not ours
                rid, team = record.get("id"), record.get("team")
                if isinstance(rid, str):
                    self.add(rid, team if isinstance(team, str) else None)
