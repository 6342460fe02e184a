"""The one loader of routing-outcome data: RouteLLM-style CSV (files, folders) and JSONL traces.

Training, evaluation and the simulator all call `load_dataset`. A RouteLLM CSV has a `prompt`
column and one outcome column per model (True/False, 0/1 or a graded score such as a 1-10 judge
score); the caller names which column is the small and which the large model. The file format
(header, outcome values, contamination files) is read by trace_format/routellm_csv.py; this
module adds benchmarks, sources and the columns training needs. Our traces
(trace_format/schema.py, docs/traces.md; read through the one trace reader,
trace_format/reader.py) carry outcomes in `outcomes` = {tier or model: score}.

A trace folder written by the proxy carries its outcomes beside the traces: the judges' label file
(trace_format/labels.py, `labels.jsonl`) and users' feedback (trace_format/feedback.py,
`feedback.jsonl`). The loader merges them into each trace record by request id, the one place
that does (training, `tune` and `simulate` all read through here): a record's own `outcomes`,
then feedback as the outcome of the tier that answered (`tier`), then labels, later ones
overriding earlier ones per tier. With `labelled_only`, requests left without both outcomes (or
without text: content logging was off) are left out and counted, as a live folder has many.

Every row keeps a request id (`ids`): a trace record's `id`, or "<CSV path>:<row>" for a CSV row,
so that per-request decisions (the `random` policy's draw) are replayed as the proxy made them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from trace_format.feedback import feedback_path_for, load_feedback
from trace_format.labels import labels_path_for, merged_outcomes
from trace_format.reader import (
    TraceFormatError,
    data_files,
    is_trace_file,
    iter_lines,
    trace_stem,
    validate,
)
from trace_format.request_text import request_text
from trace_format.routellm_csv import DEFAULT_LARGE, DEFAULT_SMALL, CsvFormatError, iter_rows
from trace_format.schema import TraceRecord

# Tier names used by our own traces when the caller names none.
DEFAULT_TRACE_SMALL = "small"
DEFAULT_TRACE_LARGE = "large"
DATA_ENV = "COST_ROUTER_DATA"


def routellm_data_dir() -> Path:
    """Where the shared RouteLLM outcome data lives: $COST_ROUTER_DATA, else a `shared` folder
    beside the checkout or one of its parents (how the development machines lay it out), else
    beside the checkout a local clone was made from (a CI clone elsewhere finds the data of the
    checkout it came from). No machine's path is written here."""
    if env := os.environ.get(DATA_ENV):
        return Path(env)
    checkout = Path(__file__).resolve().parents[1]
    for root in (checkout, _clone_source(checkout)):
        if root is None:
            continue
        for folder in root.parents:
            if (candidate := folder / "shared" / "data" / "routellm").is_dir():
                return candidate
    return checkout.parent / "shared" / "data" / "routellm"  # named in the not-found error


def _clone_source(checkout: Path) -> Path | None:
    """The local checkout `checkout` was cloned from (its origin remote, when that is a path)."""
    try:
        config = (checkout / ".git" / "config").read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r'\[remote "origin"\][^\[]*?^\s*url\s*=\s*(\S+)', config, re.M)
    if m is None or "://" in m.group(1) or ":" in m.group(1).split("/")[0]:
        return None
    source = Path(m.group(1).removeprefix("file://"))
    return source.resolve() if source.is_absolute() else (checkout / source).resolve()


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
    # A trace's prompt-cache breakdown (docs/pricing.md) and the tier whose cache it was: the
    # simulator prices a record's cached tokens only on that tier. NaN / None: not recorded.
    cached_tokens: np.ndarray | None = None
    cache_write_tokens: np.ndarray | None = None
    served_tiers: np.ndarray | None = None
    # Model answers when the data has them (RouteLLM `<model>_response`); training-time only.
    small_responses: list[str] | None = None
    large_responses: list[str] | None = None
    excluded_contaminated: int = 0
    files: list[str] = field(default_factory=list)
    # With load_dataset(labelled_only=True): requests left out for want of both outcomes, and
    # labelled ones left out for want of text (the trace logged no prompt).
    unlabelled: int = 0
    without_text: int = 0
    # Why the first unlabelled request was left out ("<file>: line N: missing field ..."), for the
    # error when none is left.
    first_unlabelled: str | None = None
    # Rows whose outcomes came (at least partly) from a label or feedback file beside the traces.
    from_labels: int = 0

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
            cached_tokens=pick(self.cached_tokens),
            cache_write_tokens=pick(self.cache_write_tokens),
            served_tiers=pick(self.served_tiers),
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
    cached_tokens: list[float] = field(default_factory=list)
    cache_write_tokens: list[float] = field(default_factory=list)
    served_tiers: list[str | None] = field(default_factory=list)
    small_responses: list[str | None] = field(default_factory=list)
    large_responses: list[str | None] = field(default_factory=list)
    excluded: int = 0
    files: list[str] = field(default_factory=list)
    unlabelled: int = 0
    without_text: int = 0
    first_unlabelled: str | None = None
    from_labels: int = 0
    # Per folder: outcomes by request id from the label and feedback files there (see _Beside).
    beside: dict[Path, _Beside] = field(default_factory=dict)


@dataclass(frozen=True)
class _Beside:
    """What a trace folder holds beside its traces: judges' outcomes and users' feedback."""

    labels: dict[str, dict[str, float]]
    feedback: dict[str, float]

    @classmethod
    def of(cls, trace: Path, rows: _Rows) -> _Beside:
        folder = trace.parent
        if folder not in rows.beside:
            rows.beside[folder] = cls(
                merged_outcomes(labels_path_for(trace)), load_feedback(feedback_path_for(trace))
            )
        return rows.beside[folder]

    def outcomes(self, record: TraceRecord) -> tuple[dict[str, float] | None, bool]:
        """The record's outcomes merged with this folder's (module docstring), and whether the
        label or feedback file gave any."""
        score = self.feedback.get(record.id)
        labelled = self.labels.get(record.id)
        if labelled is None and (score is None or record.tier is None):
            return record.outcomes, False
        merged = dict(record.outcomes or {})
        if score is not None and record.tier is not None:
            merged[record.tier] = score
        merged.update(labelled or {})
        return merged, True


def beside_outcomes(trace: Path) -> _Beside:
    """The label and feedback outcomes beside one trace file, for readers that stream a trace
    record by record (`drift report`) and merge by the same rule: `.outcomes(record)`."""
    return _Beside(merged_outcomes(labels_path_for(trace)), load_feedback(feedback_path_for(trace)))


def _benchmark_of(csv_file: Path, root: Path) -> str:
    # <root>/<benchmark>/...csv when given the data root, else the CSV's own folder name
    # (skipping RouteLLM's `responses/` level).
    if root.is_dir() and csv_file.parent != root:
        return csv_file.relative_to(root).parts[0]
    folder = csv_file.parent
    return folder.parent.name if folder.name == "responses" else folder.name


def _read_csv(path: Path, root: Path, small: str, large: str, exclude: bool, rows: _Rows) -> None:
    benchmark = _benchmark_of(path, root)
    try:
        for row in iter_rows(path, small, large, root=root, exclude_contaminated=exclude):
            if row.contaminated:
                rows.excluded += 1
                continue
            rows.prompts.append(row.prompt)
            rows.ids.append(row.id)
            rows.small.append(row.small)
            rows.large.append(row.large)
            rows.benchmark.append(benchmark)
            rows.source.append(trace_stem(path))
            rows.small_responses.append(row.small_response)
            rows.large_responses.append(row.large_response)
            for extra in (
                rows.prompt_tokens,
                rows.completion_tokens,
                rows.timestamps,
                rows.cached_tokens,
                rows.cache_write_tokens,
            ):
                extra.append(float("nan"))
            rows.teams.append(None)
            rows.served_tiers.append(None)
    except CsvFormatError as exc:
        # The format's messages already name the file and line ("<file>: line N: ...").
        raise DatasetError(str(exc)) from None
    rows.files.append(str(path))


def _outcome(outcomes: dict[str, float] | None, name: str, where: str, required: bool) -> float:
    if outcomes is None or name not in outcomes:
        if required:
            have = ", ".join(sorted(outcomes or {})) or "none"
            raise DatasetError(f"{where}: missing field 'outcomes.{name}' (outcomes: {have})")
        return float("nan")
    return float(outcomes[name])


def _read_trace(
    path: Path,
    small: str,
    large: str,
    require: bool,
    context_turns: int,
    rows: _Rows,
    labelled_only: bool = False,
) -> None:
    beside = _Beside.of(path, rows)
    try:
        for where, data in iter_lines(path):
            record = validate(data, where)
            outcomes, from_labels = beside.outcomes(record)
            if labelled_only and not (outcomes and small in outcomes and large in outcomes):
                if rows.first_unlabelled is None:
                    missing = small if small not in (outcomes or {}) else large
                    have = ", ".join(sorted(outcomes or {})) or "none"
                    rows.first_unlabelled = (
                        f"{where}: missing field 'outcomes.{missing}' (outcomes: {have})"
                    )
                rows.unlabelled += 1
                continue
            if record.prompt is None and record.messages is None:
                if labelled_only:
                    rows.without_text += 1
                    continue
                if require:
                    raise DatasetError(f"{where}: missing field 'prompt' (or 'messages')")
            prompt = record.prompt
            if prompt is None:
                # Live traces may omit content (it is logged only when configured).
                prompt = request_text({"messages": record.messages or []}, context_turns)
            rows.prompts.append(prompt)
            rows.ids.append(record.id)
            rows.small.append(_outcome(outcomes, small, where, require))
            rows.large.append(_outcome(outcomes, large, where, require))
            rows.from_labels += from_labels
            rows.benchmark.append(record.source or trace_stem(path))
            rows.source.append(record.source or trace_stem(path))
            rows.prompt_tokens.append(_num(record.prompt_tokens))
            rows.completion_tokens.append(_num(record.completion_tokens))
            rows.timestamps.append(record.time)
            rows.teams.append(record.team)
            rows.cached_tokens.append(_num(record.cached_tokens))
            rows.cache_write_tokens.append(_num(record.cache_write_tokens))
            # The tier that answered: the last one tried (a fallback's), else the chosen one.
            rows.served_tiers.append(record.tiers_tried[-1] if record.tiers_tried else record.tier)
            rows.small_responses.append(None)
            rows.large_responses.append(None)
    except TraceFormatError as exc:
        # The one reader's messages already name the file and line ("<file>: line N: ...").
        raise DatasetError(str(exc)) from None
    rows.files.append(str(path))


def _num(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def load_dataset(
    paths: str | Path | Iterable[str | Path],
    small: str | None = None,
    large: str | None = None,
    exclude_contaminated: bool = True,
    require_outcomes: bool = True,
    context_turns: int = 2,
    labelled_only: bool = False,
) -> RoutingDataset:
    """Load CSV files/folders and JSONL traces into one RoutingDataset.

    `small`/`large` name the outcome columns (CSV) or `outcomes` keys (traces); defaults are
    RouteLLM's Mixtral/GPT-4 columns for CSV and `small`/`large` for traces. A folder is walked
    by trace_format.reader.data_files (recursively; rotated traces oldest first, so rows are in
    time order; never the feedback, label, shadow or contamination file). Each trace's labels
    and feedback (the files beside it) are merged in by request id (module docstring); with
    `labelled_only`, requests without both outcomes or without text are left out (counted in
    `unlabelled`, `without_text`) instead of failing `require_outcomes`.
    """
    roots = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    rows = _Rows()
    for root in roots:
        try:
            files = data_files(root)  # the one walker: CSVs and traces, in time order
        except TraceFormatError as exc:
            raise DatasetError(str(exc)) from None
        for file in files:
            if is_trace_file(file):
                _read_trace(
                    file,
                    small or DEFAULT_TRACE_SMALL,
                    large or DEFAULT_TRACE_LARGE,
                    require_outcomes,
                    context_turns,
                    rows,
                    labelled_only,
                )
            else:
                _read_csv(
                    file,
                    root,
                    small or DEFAULT_SMALL,
                    large or DEFAULT_LARGE,
                    exclude_contaminated,
                    rows,
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
        cached_tokens=optional(rows.cached_tokens),
        cache_write_tokens=optional(rows.cache_write_tokens),
        served_tiers=np.asarray(rows.served_tiers, dtype=object),
        small_responses=[r or "" for r in rows.small_responses] if has_small else None,
        large_responses=[r or "" for r in rows.large_responses] if has_large else None,
        excluded_contaminated=rows.excluded,
        files=rows.files,
        unlabelled=rows.unlabelled,
        without_text=rows.without_text,
        first_unlabelled=rows.first_unlabelled,
        from_labels=rows.from_labels,
    )


def concat(first: RoutingDataset, second: RoutingDataset) -> RoutingDataset:
    """`first`'s rows then `second`'s, in one dataset (outcome names: `first`'s).

    For training on two kinds of data at once (a team's labelled traffic and the shipped
    training data), which name their outcome columns differently: each is loaded with its own
    names, then joined. Optional columns missing on one side are NaN (or "" for answers) there.
    """

    def column(a: np.ndarray | None, b: np.ndarray | None, na: object) -> np.ndarray | None:
        if a is None and b is None:
            return None
        dtype = object if na is None else np.float64
        left = a if a is not None else np.full(len(first), na, dtype=dtype)
        right = b if b is not None else np.full(len(second), na, dtype=dtype)
        return np.concatenate([left, right])

    def texts(a: list[str] | None, b: list[str] | None) -> list[str] | None:
        if a is None and b is None:
            return None
        return (a or [""] * len(first)) + (b or [""] * len(second))

    return replace(
        first,
        prompts=first.prompts + second.prompts,
        ids=first.ids + second.ids,
        small=np.concatenate([first.small, second.small]),
        large=np.concatenate([first.large, second.large]),
        benchmark=np.concatenate([first.benchmark, second.benchmark]),
        source=np.concatenate([first.source, second.source]),
        prompt_tokens=column(first.prompt_tokens, second.prompt_tokens, float("nan")),
        completion_tokens=column(first.completion_tokens, second.completion_tokens, float("nan")),
        timestamps=column(first.timestamps, second.timestamps, float("nan")),
        teams=column(first.teams, second.teams, None),
        cached_tokens=column(first.cached_tokens, second.cached_tokens, float("nan")),
        cache_write_tokens=column(
            first.cache_write_tokens, second.cache_write_tokens, float("nan")
        ),
        served_tiers=column(first.served_tiers, second.served_tiers, None),
        small_responses=texts(first.small_responses, second.small_responses),
        large_responses=texts(first.large_responses, second.large_responses),
        excluded_contaminated=first.excluded_contaminated + second.excluded_contaminated,
        files=first.files + second.files,
        unlabelled=first.unlabelled + second.unlabelled,
        without_text=first.without_text + second.without_text,
        first_unlabelled=first.first_unlabelled or second.first_unlabelled,
        from_labels=first.from_labels + second.from_labels,
    )
