"""The shadow file: one JSON object per line beside the traces (`shadow.jsonl`), written by the
proxy's shadow comparisons (router/learning/shadow.py).

Version 1 fields: ``schema_version``, ``request_id``, ``time``, ``team``, ``policy``,
``endpoint``, and ``primary`` / ``shadow``, each {``tier``, ``model``, ``prompt_tokens``,
``completion_tokens``, ``latency_ms``, ``cost_usd``, and ``text`` only where content storage is
on for the team}; ``prompt`` likewise. Shadow spend was charged to the evaluation cap, never to
the team. Records older than the configured retention are pruned from the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trace_format.jsonl import read_objects

SHADOW_FILE = "shadow.jsonl"  # reader.is_trace_file leaves `shadow*` files out of the traces
SHADOW_SCHEMA_VERSION = 1


def shadow_path_for(trace_path: str | Path) -> Path:
    """Where shadow records for the traces at `trace_path` are kept."""
    return Path(trace_path).parent / SHADOW_FILE


def iter_shadow(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every shadow record of a file, in file order (none if absent); the proxy appends while
    we read (trace_format/jsonl.py)."""
    return read_objects(path)
