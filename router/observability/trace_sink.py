"""Non-blocking JSONL trace writer with size rotation.

The request path only serialises a dict (orjson, microseconds) and appends the line to a queue.
A background thread wakes every ``flush_interval_s``, takes everything queued, and writes it in
one go through the stdlib ``RotatingFileHandler``'s file and rollover (``requests.jsonl`` ->
``requests.jsonl.1`` ... before a write would pass ``max_bytes``). Waking on a timer rather than
on every record keeps the writer thread from competing with the event loop for the GIL on each
request. Records are dicts with trace v1 keys (trace_format/schema.py); building a pydantic model
per request would cost more than the rest of the write path.
"""

from __future__ import annotations

import logging
import queue
import threading
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

import orjson

from trace_format.schema import SCHEMA_VERSION

log = logging.getLogger(__name__)


class TraceSink:
    def __init__(
        self, path: str | Path, max_bytes: int, backups: int, flush_interval_s: float = 0.2
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        # Used for its file and doRollover() only; we never emit log records through it.
        self._file = RotatingFileHandler(
            self.path,
            maxBytes=max_bytes,
            backupCount=max(backups, 1),
            encoding="utf-8",
            delay=True,
        )
        self._backups = backups
        self._queue: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._interval = flush_interval_s
        self._thread = threading.Thread(target=self._run, name="trace-sink", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        """Enqueue one record; never blocks on disk. Dropped silently after close()."""
        if self._stop.is_set():
            return
        record.setdefault("schema_version", SCHEMA_VERSION)
        self._queue.put_nowait(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._drain()
        self._drain()

    def _drain(self) -> None:
        lines: list[bytes] = []
        while True:
            try:
                lines.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if not lines:
            return
        try:
            self._write(lines)
        except OSError:
            log.exception("trace sink: could not write %d records to %s", len(lines), self.path)

    def _write(self, lines: list[bytes]) -> None:
        if self._file.stream is None:
            self._file.stream = self._file._open()
        stream = self._file.stream
        size = stream.tell()
        batch: list[str] = []
        for line in lines:
            if size and size + len(line) > self.max_bytes:
                stream.write("".join(batch))
                batch.clear()
                self._rotate()
                stream = self._file.stream
                size = 0
            batch.append(line.decode("utf-8"))
            size += len(line)
        stream.write("".join(batch))
        stream.flush()

    def _rotate(self) -> None:
        if self._backups == 0:
            # No backups kept: start the file afresh.
            self._file.stream.close()
            self._file.stream = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
            return
        self._file.doRollover()
        if self._file.stream is None:  # delay=True leaves the new file unopened
            self._file.stream = self._file._open()

    def close(self) -> None:
        """Flush everything queued, then stop the writer thread."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._file.close()
