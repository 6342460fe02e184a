"""The shadow file's writer: appends records, prunes those older than the retention period.

Shadow traffic is a sample, so one small append per record (in a thread, off the event loop) is
enough; pruning rewrites the file to a temporary one and swaps it in, under the same lock, so a
reader sees the old file or the new one, never half of each.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from trace_format.jsonl import jsonl_lines
from trace_format.labels import LabelRecord


class ShadowLog:
    def __init__(self, path: str | Path, labels_path: str | Path) -> None:
        self.path = Path(path)
        self.labels_path = Path(labels_path)
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        self._append(self.path, orjson.dumps(record) + b"\n")

    def append_label(self, label: LabelRecord) -> None:
        self._append(self.labels_path, label.line())

    def _append(self, path: Path, line: bytes) -> None:
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as fh:
                fh.write(line)

    def prune(self, retention_s: float, now: float | None = None) -> int:
        """Drop records whose `time` is older than `retention_s`; returns how many."""
        cutoff = (time.time() if now is None else now) - retention_s
        with self._lock:
            if not self.path.exists():
                return 0
            kept: list[bytes] = []
            dropped = 0
            for line in jsonl_lines(self.path):
                if line.value is None:
                    dropped += 1  # a torn line from a crash: nothing to keep
                    continue
                t = line.value.get("time")
                if isinstance(t, int | float) and t < cutoff:
                    dropped += 1
                else:
                    kept.append(line.raw)
            if dropped:
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_bytes(b"".join(kept))
                os.replace(tmp, self.path)
            return dropped
