"""Charges a replica owes the Redis store while it cannot reach it, replayed when it returns."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import Any

import orjson

from trace_format.jsonl import jsonl_lines

log = logging.getLogger("cost_router.budgets.redis")


class Journal:
    """Charges this replica owes the store: appended while Redis is down, replayed when it returns.

    With a path, every entry is on disk before the request returns. Replicas may share one
    configured path: each writes its own ``<path>.<pid>`` and holds an exclusive lock on it; a
    starting replica adopts the files of replicas that died (their lock is free), so a crash loses
    nothing. Replay is idempotent by request id, so adopting twice cannot charge twice.
    Without a path, entries live in memory.
    """

    def __init__(self, path: str | None) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.path: Path | None = None
        self._lock_fd: int | None = None
        if path:
            base = Path(path)
            base.parent.mkdir(parents=True, exist_ok=True)
            self.path = base.with_name(f"{base.name}.{os.getpid()}")
            self._lock_fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._adopt(base)

    def _adopt(self, base: Path) -> None:
        assert self.path is not None
        for other in sorted(base.parent.glob(base.name + ".*")):
            if other == self.path or not other.name[len(base.name) + 1 :].isdigit():
                continue
            fd = os.open(other, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # a live replica owns it
            try:
                for line in jsonl_lines(other):
                    if line.blank:
                        continue
                    if line.value is None:
                        # Not passed over, unlike other appended files: the file stays for an
                        # operator rather than a charge being lost.
                        raise ValueError(f"{other}: line {line.number}: not a journal entry")
                    self.add(line.value)
                log.warning("adopted %s from a replica that stopped", other)
                other.unlink()
            finally:
                os.close(fd)

    def add(self, entry: dict[str, Any]) -> None:
        self.entries[entry["rid"]] = entry
        if self.path:
            with self.path.open("ab") as fh:
                fh.write(orjson.dumps(entry) + b"\n")
                fh.flush()
                os.fsync(fh.fileno())

    def done(self, rids: list[str]) -> None:
        for rid in rids:
            self.entries.pop(rid, None)
        if self.path:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in self.entries.values()))
            # The lock follows the inode, so lock the new file before it takes the name.
            fd = os.open(tmp, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            tmp.replace(self.path)
            if self._lock_fd is not None:
                os.close(self._lock_fd)
            self._lock_fd = fd

    def close(self) -> None:
        """A clean stop: an empty journal file is removed, a non-empty one left for adoption."""
        if self.path and not self.entries and self.path.exists():
            self.path.unlink()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
