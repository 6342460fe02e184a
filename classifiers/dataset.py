"""The one loader of routing-outcome data: RouteLLM-style CSV (files, folders) and JSONL traces.

Training, evaluation and the simulator all call `load_dataset`. A RouteLLM CSV has a `prompt`
column and one outcome column per model (True/False, 0/1 or a graded score such as a 1-10 judge
score); the caller names which column is the small and which the large model. Our traces
(trace_format/schema.py, docs/traces.md; read through the one trace reader,
trace_format/reader.py) carry outcomes in `outcomes` = {tier or model: score}.

Every row keeps a request id (`ids`): a trace record's `id`, or "<CSV path>:<row>" for a CSV row,
so that per-request decisions (the `random` policy's draw) are replayed as the proxy made them.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from trace_format.reader import TraceFormatError, is_trace_file, iter_lines, validate
from trace_format.request_text import request_text
from trace_format.schema import TraceRecord

# RouteLLM's evaluation set: Mixtral is the cheap model, GPT-4 the expensive one.
DEFAULT_SMALL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
DEFAULT_LARGE = "gpt-4-1106-preview"
# Tier names used by our own traces when the caller names none.
DEFAULT_TRACE_SMALL = "small"
DEFAULT_TRACE_LARGE = "large"
CONTAMINATION_FILE = "contaminated_prompts.jsonl"
DATA_ENV = "COST_ROUTER_DATA"

_TRUE = {"true", "t", "yes", "y"}
_FALSE = {"false", "f", "no", "n"}

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def routellm_data_dir() -> Path:
    """Where the shared RouteLLM outcome data lives: $COST_ROUTER_DATA, else ../shared beside the
    checkout (how the development and CI machines lay it out), else /work/shared."""
    if env := os.environ.get(DATA_ENV):
        return Path(env)
    beside = Path(__file__).resolve().parents[2] / "shared" / "data" / "routellm"
    return beside if beside.is_dir() else Path("/work/shared/data/routellm")


class DatasetError(ValueError):
    """Unreadable routing data; the message names the file, line and column."""


@dataclass(frozen=True)
class RoutingDataset:
    """Prompts with both models' outcomes (NaN where unknown) and where each row came from."""

    prompts: list[str]
    small: np.ndarray
    large: np.ndarray
    benchmark: np.ndarray
    source: np.ndarray
    # Request id per row: the trace record's `id`; for a CSV row "<path>:<row>" (path relative to
    # the folder given, row = 1-based data row, contaminated rows counted), stable across loads.
    ids: list[str]
    small_name: str = DEFAULT_SMALL
    large_name: str = DEFAULT_LARGE
    prompt_tokens: np.ndarray | None = None
    completion_tokens: np.ndarray | None = None
    timestamps: np.ndarray | None = None
    teams: np.ndarray | None = None
    # Model answers when the data has them (RouteLLM `<model>_response`); training-time only.
    small_responses: list[str] | None = None
    large_responses: list[str] | None = None
    excluded_contaminated: int = 0
    files: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def benchmarks(self) -> list[str]:
        return sorted(set(self.benchmark.tolist()))

    def subset(self, mask: np.ndarray) -> RoutingDataset:
        """Rows where `mask` (bool array or index array) selects."""
        idx = np.flatnonzero(mask) if np.asarray(mask).dtype == bool else np.asarray(mask)

        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        def pick_list(a: list[str] | None) -> list[str] | None:
            return None if a is None else [a[i] for i in idx]

        return replace(
            self,
            prompts=[self.prompts[i] for i in idx],
            ids=[self.ids[i] for i in idx],
            small=self.small[idx],
            large=self.large[idx],
            benchmark=self.benchmark[idx],
            source=self.source[idx],
            prompt_tokens=pick(self.prompt_tokens),
            completion_tokens=pick(self.completion_tokens),
            timestamps=pick(self.timestamps),
            teams=pick(self.teams),
            small_responses=pick_list(self.small_responses),
            large_responses=pick_list(self.large_responses),
        )


@dataclass
class _Rows:
    prompts: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    small: list[float] = field(default_factory=list)
    large: list[float] = field(default_factory=list)
    benchmark: list[str] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    prompt_tokens: list[float] = field(default_factory=list)
    completion_tokens: list[float] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    teams: list[str | None] = field(default_factory=list)
    small_responses: list[str | None] = field(default_factory=list)
    large_responses: list[str | None] = field(default_factory=list)
    excluded: int = 0
    files: list[str] = field(default_factory=list)


def parse_outcome(value: str | float | bool | None, where: str) -> float:
    """True/False, 1/0 or a graded number -> float; empty -> NaN (unknown)."""
    if isinstance(value, bool):
        return float(value)
    if value is None:
        return float("nan")
    if isinstance(value, int | float):
        return float(value)
    text = value.strip().lower()
    if not text:
        return float("nan")
    if text in _TRUE:
        return 1.0
    if text in _FALSE:
        return 0.0
    try:
        return float(text)
    except ValueError:
        raise DatasetError(f"{where}: not an outcome (True/False or a number): {value!r}") from None


def contaminated_prompts(paths: Iterable[Path]) -> set[str]:
    """`eval_prompt` of every contamination file (RouteLLM drops these rows before evaluating)."""
    prompts: set[str] = set()
    for path in paths:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                prompts.add(json.loads(line)["eval_prompt"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DatasetError(f"{path}:{lineno}: expected JSON with 'eval_prompt'") from None
    return prompts


def _contamination_files(csv_file: Path, root: Path) -> list[Path]:
    # RouteLLM keeps the file next to the CSV (gsm8k/) or one folder up (mmlu/responses/).
    found = []
    for folder in [csv_file.parent, *csv_file.parent.parents]:
        candidate = folder / CONTAMINATION_FILE
        if candidate.is_file():
            found.append(candidate)
        if folder == root or folder == root.parent:
            break
    return found


def _benchmark_of(csv_file: Path, root: Path) -> str:
    # <root>/<benchmark>/...csv when given the data root, else the CSV's own folder name
    # (skipping RouteLLM's `responses/` level).
    if root.is_dir() and csv_file.parent != root:
        return csv_file.relative_to(root).parts[0]
    folder = csv_file.parent
    return folder.parent.name if folder.name == "responses" else folder.name


def _read_csv(path: Path, root: Path, small: str, large: str, exclude: bool, rows: _Rows) -> None:
    banned = contaminated_prompts(_contamination_files(path, root)) if exclude else set()
    benchmark = _benchmark_of(path, root)
    name = _csv_name(path, root)
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise DatasetError(f"{path}: line 1: empty file, expected a header with 'prompt'")
        for column in ("prompt", small, large):
            if column not in header:
                raise DatasetError(
                    f"{path}: line 1: missing column {column!r} (columns: {', '.join(header)})"
                )
        ip, is_, il = header.index("prompt"), header.index(small), header.index(large)
        rs = header.index(f"{small}_response") if f"{small}_response" in header else None
        rl = header.index(f"{large}_response") if f"{large}_response" in header else None
        start = reader.line_num + 1
        row = 0
        for record in reader:
            where = f"{path}: line {start}"
            start = reader.line_num + 1
            if not record:
                continue
            row += 1
            if len(record) != len(header):
                raise DatasetError(f"{where}: {len(record)} fields, header has {len(header)}")
            prompt = record[ip]
            if prompt in banned:
                rows.excluded += 1
                continue
            rows.prompts.append(prompt)
            rows.ids.append(f"{name}:{row}")
            rows.small.append(parse_outcome(record[is_], f"{where}: column {small!r}"))
            rows.large.append(parse_outcome(record[il], f"{where}: column {large!r}"))
            rows.benchmark.append(benchmark)
            rows.source.append(path.stem)
            rows.small_responses.append(record[rs] if rs is not None else None)
            rows.large_responses.append(record[rl] if rl is not None else None)
            for extra in (rows.prompt_tokens, rows.completion_tokens, rows.timestamps):
                extra.append(float("nan"))
            rows.teams.append(None)
    rows.files.append(str(path))


def _csv_name(path: Path, root: Path) -> str:
    # Relative to the folder given (e.g. "gsm8k/gsm8k_responses.csv"), the file name when the
    # file itself was given: the same row gets the same id whichever way the file is reached.
    return path.relative_to(root).as_posix() if root.is_dir() else path.name


def _outcome(record: TraceRecord, name: str, where: str, required: bool) -> float:
    if record.outcomes is None or name not in record.outcomes:
        if required:
            have = ", ".join(sorted(record.outcomes or {})) or "none"
            raise DatasetError(f"{where}: missing field 'outcomes.{name}' (outcomes: {have})")
        return float("nan")
    return float(record.outcomes[name])


def _read_trace(
    path: Path, small: str, large: str, require: bool, context_turns: int, rows: _Rows
) -> None:
    try:
        for where, data in iter_lines(path):
            record = validate(data, where)
            if record.prompt is None and record.messages is None and require:
                raise DatasetError(f"{where}: missing field 'prompt' (or 'messages')")
            prompt = record.prompt
            if prompt is None:
                # Live traces may omit content (it is logged only when configured).
                prompt = request_text({"messages": record.messages or []}, context_turns)
            rows.prompts.append(prompt)
            rows.ids.append(record.id)
            rows.small.append(_outcome(record, small, where, require))
            rows.large.append(_outcome(record, large, where, require))
            rows.benchmark.append(record.source or path.stem)
            rows.source.append(record.source or path.stem)
            rows.prompt_tokens.append(_num(record.prompt_tokens))
            rows.completion_tokens.append(_num(record.completion_tokens))
            rows.timestamps.append(record.time)
            rows.teams.append(record.team)
            rows.small_responses.append(None)
            rows.large_responses.append(None)
    except TraceFormatError as exc:
        # The one reader's messages already name the file and line ("<file>: line N: ...").
        raise DatasetError(str(exc)) from None
    rows.files.append(str(path))


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        # CSVs, and the trace folder layout's files (rotated ones included, feedback excluded).
        yield from sorted(p for p in path.rglob("*") if p.name != CONTAMINATION_FILE
                          and (p.suffix == ".csv" or is_trace_file(p)))
    elif path.is_file():
        yield path
    else:
        raise DatasetError(f"{path}: no such file or folder")


def load_dataset(
    paths: str | Path | Iterable[str | Path],
    small: str | None = None,
    large: str | None = None,
    exclude_contaminated: bool = True,
    require_outcomes: bool = True,
    context_turns: int = 2,
) -> RoutingDataset:
    """Load CSV files/folders and JSONL traces into one RoutingDataset.

    `small`/`large` name the outcome columns (CSV) or `outcomes` keys (traces); defaults are
    RouteLLM's Mixtral/GPT-4 columns for CSV and `small`/`large` for traces.
    """
    roots = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    rows = _Rows()
    for root in roots:
        for file in _files(root):
            if is_trace_file(file):
                _read_trace(
                    file,
                    small or DEFAULT_TRACE_SMALL,
                    large or DEFAULT_TRACE_LARGE,
                    require_outcomes,
                    context_turns,
                    rows,
                )
            else:
                _read_csv(
                    file, root, small or DEFAULT_SMALL, large or DEFAULT_LARGE,
                    exclude_contaminated, rows,
                )
    if not rows.files:
        raise DatasetError(f"no .csv or .jsonl files under {', '.join(map(str, roots))}")
    return _to_dataset(rows, small, large)


def _to_dataset(rows: _Rows, small: str | None, large: str | None) -> RoutingDataset:
    def optional(values: list[float]) -> np.ndarray | None:
        arr = np.asarray(values, dtype=np.float64)
        return None if np.isnan(arr).all() else arr

    has_small = any(r is not None for r in rows.small_responses)
    has_large = any(r is not None for r in rows.large_responses)
    teams = np.asarray(rows.teams, dtype=object)
    return RoutingDataset(
        prompts=rows.prompts,
        ids=rows.ids,
        small=np.asarray(rows.small, dtype=np.float64),
        large=np.asarray(rows.large, dtype=np.float64),
        benchmark=np.asarray(rows.benchmark, dtype=object),
        source=np.asarray(rows.source, dtype=object),
        small_name=small or DEFAULT_SMALL,
        large_name=large or DEFAULT_LARGE,
        prompt_tokens=optional(rows.prompt_tokens),
        completion_tokens=optional(rows.completion_tokens),
        timestamps=optional(rows.timestamps),
        teams=None if all(t is None for t in rows.teams) else teams,
        small_responses=[r or "" for r in rows.small_responses] if has_small else None,
        large_responses=[r or "" for r in rows.large_responses] if has_large else None,
        excluded_contaminated=rows.excluded,
        files=rows.files,
    )
