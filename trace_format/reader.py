"""The one reader of trace files (JSONL, one TraceRecord per line) with the one version check,
the one walker of data folders (`data_files`: traces and RouteLLM CSVs, rotated files oldest
first), and the bounded reorder of a proxy's traces into arrival order (`iter_lines_by_time`).

Training, the policies' reference traces, the simulator, replay tiers, the A/B report and the
feedback id index all read traces through here, so a schema change is handled in one place. The
files kept beside the traces, appended to while they are read (labels, feedback, shadow
records), go through trace_format/jsonl.py's tolerant reader instead.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from trace_format.feedback import FEEDBACK_FILE
from trace_format.labels import LABELS_FILE
from trace_format.routellm_csv import CONTAMINATION_FILE
from trace_format.schema import SUPPORTED_VERSIONS, TraceRecord

REQUIRED_FIELDS = ("schema_version", "id", "time")


class TraceFormatError(ValueError):
    """A trace that cannot be read; the message names the file and the line."""


def parse_line(raw: bytes, where: str) -> dict[str, Any]:
    """One trace line as a dict, after the version check (fields are not validated).

    orjson is the fast path; a line it rejects is parsed again as Python's json module writes and
    reads it (NaN/Infinity, which json.dumps writes for a NaN outcome; invalid UTF-8 replaced).
    """
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            data = json.loads(raw.decode("utf-8", errors="replace"))
        except json.JSONDecodeError:
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


def _rotation(name: str) -> tuple[str, int] | None:
    """("requests.jsonl", N) for a rotated "requests.jsonl.N", else None."""
    base, dot, n = name.rpartition(".")
    return (base, int(n)) if dot and base.endswith(".jsonl") and n.isdigit() else None


# Prefix of the shadow comparisons' files (router/learning): the counterpart tier's answers to
# sampled requests, kept beside the traces; they are not requests.
SHADOW_PREFIX = "shadow"


def is_trace_file(path: Path) -> bool:
    """The one rule for a trace file: `*.jsonl` or a rotated `*.jsonl.N`, but not the files kept
    beside the traces (the feedback file, trace_format/feedback.py; the label file,
    trace_format/labels.py; shadow answers, `shadow*.jsonl`) nor RouteLLM's contamination file
    (routellm_csv.py)."""
    name = path.name
    if name in (FEEDBACK_FILE, LABELS_FILE, CONTAMINATION_FILE) or name.startswith(SHADOW_PREFIX):
        return False
    return name.endswith(".jsonl") or _rotation(name) is not None


def is_csv_file(path: Path) -> bool:
    """A RouteLLM CSV (trace_format/routellm_csv.py)."""
    return path.suffix == ".csv"


def trace_stem(path: Path) -> str:
    """A file's name without its extension or rotation number: `requests` for `requests.jsonl`
    and `requests.jsonl.3`, `gsm8k_responses` for `gsm8k_responses.csv`."""
    rotated = _rotation(path.name)
    return Path(rotated[0]).stem if rotated else path.stem


def _time_order(path: Path) -> tuple[tuple[str, ...], int]:
    # Sorted as the paths are, except that a trace's rotated files come oldest first and before
    # the current file (`.10`, `.2`, `.1`, then the file itself), so rows are in time order.
    base, n = _rotation(path.name) or (path.name, 0)
    return (*path.parent.parts, base), -n


def data_files(path: str | Path) -> list[Path]:
    """The files a path names: a file is itself; a folder holds, recursively, its RouteLLM CSVs
    and trace files (`is_trace_file`), sorted by path with each trace's rotated files oldest
    first. The one walker of data folders (training, the simulator, replay tiers)."""
    p = Path(path)
    if p.is_dir():
        found = (f for f in p.rglob("*") if f.is_file() and (is_csv_file(f) or is_trace_file(f)))
        return sorted(found, key=_time_order)
    if p.is_file():
        return [p]
    raise TraceFormatError(f"{p}: not found (no such file or folder)")


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Each path given, or the trace files of a trace folder (its own, not its subfolders': the
    folder's feedback file goes with them), in `data_files` order: rotated files oldest first."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files += [f for f in data_files(p) if f.parent == p and is_trace_file(f)]
        elif p.exists():
            files.append(p)
        else:
            raise TraceFormatError(f"trace file not found: {p}")
    return files


# How far out of time order a proxy's trace may be. The proxy writes a record when its request
# finishes, stamped with the time it arrived, so a record is at most one request's latency
# behind the newest one written before it. Ten minutes is ten times a tier's default `timeout_s`;
# a record later than that (a long stream, many fallbacks) is refused, never reordered wrongly.
REORDER_WINDOW_S = 600.0
# Records held back at once while they wait for their window to pass: the memory bound.
MAX_REORDER_HELD = 1_000_000


def trace_chains(files: Sequence[Path]) -> list[list[Path]]:
    """The files one writer wrote, together: a trace and its rotated files (`requests.jsonl.2`,
    `.1`, then `requests.jsonl`), each chain in `data_files` order. Another trace file in the
    folder (another replica's) is another chain."""
    chains: dict[tuple[Path, str], list[Path]] = {}
    for f in sorted(files, key=_time_order):
        base = (_rotation(f.name) or (f.name, 0))[0]
        chains.setdefault((f.parent, base), []).append(f)
    return list(chains.values())


def _time_of(data: dict[str, Any], where: str) -> float:
    t = data.get("time")
    if isinstance(t, bool) or not isinstance(t, int | float) or t != t:
        raise TraceFormatError(f"{where}: missing field 'time' (arrival timestamp)")
    return float(t)


def _reordered(
    chain: Sequence[Path], window_s: float, max_held: int
) -> Iterator[tuple[float, str, dict[str, Any]]]:
    """One writer's records by arrival time: each is held until a record `window_s` newer has
    been read, so a record at most `window_s` late still lands in its place."""
    held: list[tuple[float, int, str, dict[str, Any]]] = []
    released = newest = float("-inf")
    seq = 0
    for file in chain:
        for where, data in iter_lines(file):
            t = _time_of(data, where)
            if t < released:
                raise TraceFormatError(
                    f"{where}: time {t!r} is {released - t:.6g} s before a record already "
                    f"replayed: out of time order by more than the reorder window "
                    f"({window_s:g} s; the proxy writes a record when it finishes, so a trace "
                    "is out of order by at most one request's latency)"
                )
            heapq.heappush(held, (t, seq, where, data))
            seq += 1
            if len(held) > max_held:
                raise TraceFormatError(
                    f"{where}: more than {max_held} records within {window_s:g} s of each other: "
                    "over the reorder window's memory bound"
                )
            newest = max(newest, t)
            while held and held[0][0] <= newest - window_s:
                t0, _, w0, d0 = heapq.heappop(held)
                released = t0
                yield t0, w0, d0
    while held:
        t0, _, w0, d0 = heapq.heappop(held)
        yield t0, w0, d0


def iter_lines_by_time(
    files: Sequence[Path],
    window_s: float = REORDER_WINDOW_S,
    max_held: int = MAX_REORDER_HELD,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, dict) of every line of trace files in arrival-time order, in bounded memory: per
    writer (`trace_chains`) a reorder window of `window_s` seconds holding at most `max_held`
    records, then the writers merged by time. A record later than the window, a line without a
    time or more records than the bound is a TraceFormatError naming the line; ties keep file
    order."""
    chains = [_reordered(c, window_s, max_held) for c in trace_chains(files)]
    for _, where, data in heapq.merge(*chains, key=lambda row: row[0]):
        yield where, data
