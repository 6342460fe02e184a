"""The simulator's view of a trace: columns as numpy arrays, two outcome roles (small, large).

Rows come from the one loader (classifiers.dataset.load_dataset: RouteLLM CSVs and our JSONL
traces) or from Parquet (large traces, see simulations/parquet_io.py), each with its request id
(what randomised policies draw on, as in the proxy). Roles map onto the config's
cheapest and priciest tier. Token counts the trace lacks are estimated from text with tiktoken
(backends.tokens, the proxy's own counter): prompt tokens from the prompt, completion tokens from
that model's recorded answer, else a default the caller gives.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from backends.tokens import count_tokens
from classifiers.dataset import RoutingDataset
from simulations.latency import first_out_of_order

SMALL, LARGE = 0, 1


class TraceError(ValueError):
    """A trace the simulator cannot replay; the message names the record."""


@dataclass(frozen=True)
class RecordedCache:
    """The prompt-cache breakdown a trace recorded (docs/pricing.md): what each record read from
    and wrote to the cache of the tier that served it. The simulator prices those tokens at that
    tier's cache prices when it routes the record to the same tier; on another tier that cache
    was not there, so the prompt is fresh (modelling caches across tiers and turns is the
    session replay's: simulations/sessions.py)."""

    served: np.ndarray  # (n,) object: the tier that answered each record (None: unknown)
    cached_tokens: np.ndarray  # (n,) int64, 0 where not recorded
    cache_write_tokens: np.ndarray  # (n,) int64, 0 where not recorded

    def take(self, idx: np.ndarray) -> RecordedCache:
        return RecordedCache(
            self.served[idx], self.cached_tokens[idx], self.cache_write_tokens[idx]
        )

    def on(self, tiers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cached, written) per record when record i is served by tiers[i] (names)."""
        same = tiers == self.served
        return np.where(same, self.cached_tokens, 0), np.where(same, self.cache_write_tokens, 0)


class MissingTimesError(TraceError):
    """A replay over time needs every record's arrival time ('time') and some have none; the
    command that raises it knows the remedy (what-if: --arrival-rate) and adds it."""


@dataclass(frozen=True)
class ReplayTrace:
    texts: list[str]  # what the classifier scores
    quality: np.ndarray  # (n, 2) outcome per role; NaN = unknown
    prompt_tokens: np.ndarray  # (n,) int64
    completion_tokens: np.ndarray  # (n, 2) int64 per role
    times: np.ndarray | None = None  # (n,) UNIX seconds
    teams: np.ndarray | None = None  # (n,) object
    scores: np.ndarray | None = None  # (n,) recorded scores, when the trace has them
    role_names: tuple[str, str] = ("small", "large")  # outcome column/key of each role
    names: np.ndarray | None = None  # (n,) record labels for errors; None: "<source>: record i"
    source: str = "trace"
    ids: list[str] | None = None  # request ids (trace `id`), what randomised policies draw on
    cache: RecordedCache | None = None  # None: the trace recorded no prompt-cache breakdown

    def __post_init__(self) -> None:
        if len(self.texts) == 0:
            raise TraceError("empty trace: no requests to replay")

    def __len__(self) -> int:
        return len(self.texts)

    def units(self) -> list[str]:
        """Each request's id, as the proxy's policies saw it; row numbers if the trace has none."""
        return self.ids if self.ids is not None else [str(i) for i in range(len(self))]

    def record(self, i: int) -> str:
        return str(self.names[i]) if self.names is not None else f"{self.source}: record {i}"

    def has_times(self) -> bool:
        """Every record has an arrival time."""
        return self.times is not None and not np.isnan(self.times).any()

    def require_times(self) -> np.ndarray:
        """Arrival times, checked present and sorted (the error names the first bad record)."""
        if self.times is None or np.isnan(self.times).any():
            i = 0 if self.times is None else int(np.flatnonzero(np.isnan(self.times))[0])
            raise MissingTimesError(f"{self.record(i)}: missing field 'time' (arrival timestamp)")
        i = first_out_of_order(self.times)
        if i is not None:
            raise TraceError(
                f"{self.record(i)}: timestamps are not sorted: time {self.times[i]!r} is before "
                f"the previous record's {self.times[i - 1]!r}"
            )
        return self.times

    def require_teams(self) -> np.ndarray:
        if self.teams is None:
            raise TraceError(f"{self.record(0)}: missing field 'team'")
        missing = [i for i, t in enumerate(self.teams) if not t]
        if missing:
            raise TraceError(f"{self.record(missing[0])}: missing field 'team'")
        return self.teams

    def require_quality(self) -> np.ndarray:
        nan = np.isnan(self.quality)
        if nan.any():
            i, role = (int(v) for v in np.argwhere(nan)[0])
            name = "small" if role == SMALL else "large"
            raise TraceError(f"{self.record(i)}: missing field 'outcomes' for the {name} tier")
        return self.quality

    def take(self, idx: np.ndarray) -> ReplayTrace:
        def opt(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        return replace(
            self,
            texts=[self.texts[i] for i in idx],
            quality=self.quality[idx],
            prompt_tokens=self.prompt_tokens[idx],
            completion_tokens=self.completion_tokens[idx],
            names=opt(self.names),
            times=opt(self.times),
            teams=opt(self.teams),
            scores=opt(self.scores),
            ids=None if self.ids is None else [self.ids[i] for i in idx],
            cache=None if self.cache is None else self.cache.take(idx),
        )


def _record_names(ds: RoutingDataset) -> np.ndarray:
    # Per-file row numbers: "gsm8k_responses row 12" is findable, a global index is not.
    names = np.empty(len(ds), dtype=object)
    counters: dict[str, int] = {}
    for i, src in enumerate(ds.source.tolist()):
        counters[src] = counters.get(src, 0) + 1
        names[i] = f"record {i} ({src} row {counters[src]})"
    return names


def _completion_tokens(ds: RoutingDataset, names: np.ndarray, default: int | None) -> np.ndarray:
    n = len(ds)
    out = np.full((n, 2), -1, dtype=np.int64)
    if ds.completion_tokens is not None:
        known = ~np.isnan(ds.completion_tokens)
        out[known] = ds.completion_tokens[known, None].astype(np.int64)
    for role, answers in ((SMALL, ds.small_responses), (LARGE, ds.large_responses)):
        if answers is None:
            continue
        fill = [i for i in np.flatnonzero(out[:, role] < 0) if answers[i]]
        out[fill, role] = [count_tokens(answers[i]) for i in fill]
    missing = np.argwhere(out < 0)
    if missing.size:
        if default is None:
            i = int(missing[0][0])
            raise TraceError(
                f"{names[i]}: missing field 'completion_tokens' (and no answer text to count); "
                "give a default (--completion-tokens N)"
            )
        out[out < 0] = default
    return out


def _prompt_tokens(ds: RoutingDataset) -> np.ndarray:
    out = np.full(len(ds), -1, dtype=np.int64)
    if ds.prompt_tokens is not None:
        known = ~np.isnan(ds.prompt_tokens)
        out[known] = ds.prompt_tokens[known].astype(np.int64)
    todo = np.flatnonzero(out < 0)
    cache: dict[str, int] = {}
    for i in todo.tolist():
        text = ds.prompts[i]
        if text not in cache:
            cache[text] = count_tokens(text)
        out[i] = cache[text]
    return out


def _recorded_cache(ds: RoutingDataset) -> RecordedCache | None:
    if ds.cached_tokens is None and ds.cache_write_tokens is None:
        return None

    def counts(values: np.ndarray | None) -> np.ndarray:
        if values is None:
            return np.zeros(len(ds), dtype=np.int64)
        return np.where(np.isnan(values), 0, values).astype(np.int64)

    served = ds.served_tiers if ds.served_tiers is not None else np.full(len(ds), None, object)
    return RecordedCache(served, counts(ds.cached_tokens), counts(ds.cache_write_tokens))


def from_dataset(ds: RoutingDataset, default_completion_tokens: int | None = None) -> ReplayTrace:
    if len(ds) == 0:
        raise TraceError(f"empty trace: no requests in {', '.join(ds.files) or 'the input'}")
    names = _record_names(ds)
    return ReplayTrace(
        texts=list(ds.prompts),
        quality=np.stack([ds.small, ds.large], axis=1),
        prompt_tokens=_prompt_tokens(ds),
        completion_tokens=_completion_tokens(ds, names, default_completion_tokens),
        names=names,
        times=ds.timestamps,
        teams=ds.teams,
        role_names=(ds.small_name, ds.large_name),
        ids=list(ds.ids),
        cache=_recorded_cache(ds),
    )
