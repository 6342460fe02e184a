"""The RouteLLM CSV file format: the one reader of `prompt` + per-model outcome columns.

A RouteLLM CSV has a `prompt` column and one outcome column per model (True/False, 0/1 or a
graded score such as a 1-10 judge score), optionally a `<model>_response` column with that
model's answer. Rows whose prompt is listed in a `contaminated_prompts.jsonl` next to (or above)
the CSV are dropped before evaluating, as RouteLLM does.

Training and the simulator read these files through classifiers/dataset.py, `kind: replay` tiers
through backends/recorded.py; both come here for the format, so they see the same rows.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# RouteLLM's evaluation set: Mixtral is the cheap model, GPT-4 the expensive one.
DEFAULT_SMALL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
DEFAULT_LARGE = "gpt-4-1106-preview"
CONTAMINATION_FILE = "contaminated_prompts.jsonl"
RESPONSE_SUFFIX = "_response"

_TRUE = {"true", "t", "yes", "y"}
_FALSE = {"false", "f", "no", "n"}

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


class CsvFormatError(ValueError):
    """An unreadable RouteLLM CSV (or contamination file); the message names the file and line."""


@dataclass(frozen=True, slots=True)
class CsvRow:
    """One data row: the prompt, both models' outcomes (NaN = unknown) and their answers."""

    where: str  # "<file>: line N", the row's first physical line
    id: str  # "<name>:<row>", row = 1-based data row, contaminated rows counted
    prompt: str
    small: float
    large: float
    small_response: str | None  # None when the file has no `<small>_response` column
    large_response: str | None
    # Listed in a contamination file: callers drop it (its outcomes are left unparsed, NaN).
    contaminated: bool = False


def parse_outcome(value: str | float | bool | None, where: str) -> float:
    """True/False, 1/0 or a graded number -> float; empty -> NaN (unknown)."""
    if isinstance(value, bool):
        return float(value)
    if value is None:
        return math.nan
    if isinstance(value, int | float):
        return float(value)
    text = value.strip().lower()
    if not text:
        return math.nan
    if text in _TRUE:
        return 1.0
    if text in _FALSE:
        return 0.0
    try:
        return float(text)
    except ValueError:
        raise CsvFormatError(
            f"{where}: not an outcome (True/False or a number): {value!r}"
        ) from None


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
                raise CsvFormatError(f"{path}:{lineno}: expected JSON with 'eval_prompt'") from None
    return prompts


def contamination_files(csv_file: Path, root: Path) -> list[Path]:
    """The contamination files that apply to `csv_file`, searched from its folder up to `root`
    (the folder the caller was given, or the CSV itself)."""
    # RouteLLM keeps the file next to the CSV (gsm8k/) or one folder up (mmlu/responses/).
    found = []
    for folder in [csv_file.parent, *csv_file.parent.parents]:
        candidate = folder / CONTAMINATION_FILE
        if candidate.is_file():
            found.append(candidate)
        if folder == root or folder == root.parent:
            break
    return found


def csv_name(path: Path, root: Path) -> str:
    """The name in a row id: relative to the folder given (e.g. "gsm8k/gsm8k_responses.csv"), the
    file name when the file itself was given. Ids are stable across loads of the same path, but
    a row read through a folder and the same row read as a file get different ids."""
    return path.relative_to(root).as_posix() if root.is_dir() else path.name


def iter_rows(
    path: Path,
    small: str = DEFAULT_SMALL,
    large: str = DEFAULT_LARGE,
    root: Path | None = None,
    exclude_contaminated: bool = True,
) -> Iterator[CsvRow]:
    """Each data row of one RouteLLM CSV, with `small`/`large` naming the outcome columns.

    `root` is what the caller was given (a folder holding the CSV, or the CSV itself, the
    default): it bounds the search for contamination files and names the rows (`csv_name`).
    Contaminated rows are yielded flagged (when `exclude_contaminated`) so callers can count them.
    """
    root = path if root is None else root
    banned = contaminated_prompts(contamination_files(path, root) if exclude_contaminated else [])
    name = csv_name(path, root)
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise CsvFormatError(f"{path}: line 1: empty file, expected a header with 'prompt'")
        for column in ("prompt", small, large):
            if column not in header:
                raise CsvFormatError(
                    f"{path}: line 1: missing column {column!r} (columns: {', '.join(header)})"
                )
        ip, is_, il = header.index("prompt"), header.index(small), header.index(large)
        rs = _index(header, small + RESPONSE_SUFFIX)
        rl = _index(header, large + RESPONSE_SUFFIX)
        start = reader.line_num + 1
        row = 0
        for record in reader:
            where = f"{path}: line {start}"
            start = reader.line_num + 1
            if not record:
                continue
            row += 1
            if len(record) != len(header):
                raise CsvFormatError(f"{where}: {len(record)} fields, header has {len(header)}")
            prompt = record[ip]
            small_response = record[rs] if rs is not None else None
            large_response = record[rl] if rl is not None else None
            if prompt in banned:
                yield CsvRow(
                    where,
                    f"{name}:{row}",
                    prompt,
                    math.nan,
                    math.nan,
                    small_response,
                    large_response,
                    contaminated=True,
                )
                continue
            yield CsvRow(
                where,
                f"{name}:{row}",
                prompt,
                parse_outcome(record[is_], f"{where}: column {small!r}"),
                parse_outcome(record[il], f"{where}: column {large!r}"),
                small_response,
                large_response,
            )


def _index(header: list[str], column: str) -> int | None:
    return header.index(column) if column in header else None
