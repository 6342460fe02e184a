"""What the router knows about one tier's server: `TierSignals`, derived from two scrapes.

Rates need two polls: the acceptance rate is (accepted tokens added) / (draft tokens added)
between consecutive scrapes, the mean time to first token is (added histogram sum) / (added
histogram count), and so on. A server with no /metrics (llama-cpp-python's answers 404) is not an
error: its state is `no_metrics`, and the policies simply see no load for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from backends.base import TierLoad
from backends.metrics_scrape import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    E2E,
    GENERATION_TOKENS,
    KV_CACHE,
    RUNNING,
    TPOT,
    TTFT,
    WAITING,
    Scrape,
)

Status = Literal["ok", "no_metrics", "unreachable", "error", "not_polled"]


@dataclass(frozen=True, slots=True)
class TierSignals:
    """What the router knows about one tier's server at one moment."""

    tier: str
    status: Status = "not_polled"
    ready: bool = False
    time: float = 0.0  # UNIX seconds of the poll
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    spec_acceptance: float | None = None  # accepted / draft tokens between the last two polls
    ttft_s: float | None = None  # mean time to first token of requests finished in the window
    tpot_s: float | None = None  # mean time per output token in the window
    e2e_s: float | None = None
    generation_tokens_per_s: float | None = None
    detail: str = ""

    def load(self) -> TierLoad:
        return TierLoad(
            running=self.running,
            waiting=self.waiting,
            kv_cache_usage=self.kv_cache_usage,
            spec_acceptance=self.spec_acceptance,
        )

    def numeric(self) -> dict[str, float]:
        """Flat numbers for traces and snapshots' consumers; absent values are left out."""
        out = {"ready": float(self.ready), "metrics_available": float(self.status == "ok")}
        for name in (
            "running",
            "waiting",
            "kv_cache_usage",
            "spec_acceptance",
            "ttft_s",
            "tpot_s",
            "e2e_s",
            "generation_tokens_per_s",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = float(value)
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierSignals:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _delta(cur: Scrape, prev: Scrape | None, name: str) -> float | None:
    """Counter increase since the previous scrape; None when unknown or the counter was reset."""
    if prev is None or name not in cur.counters or name not in prev.counters:
        return None
    d = cur.counters[name] - prev.counters[name]
    return d if d >= 0 else None  # a decrease means the server restarted


def _mean_in_window(cur: Scrape, prev: Scrape | None, names: Iterable[str]) -> float | None:
    for name in names:
        total, count = _delta(cur, prev, f"{name}_sum"), _delta(cur, prev, f"{name}_count")
        if total is not None and count:
            return total / count
    return None


def derive(
    tier: str,
    cur: Scrape,
    prev: Scrape | None,
    elapsed_s: float,
    last: TierSignals | None = None,
    now: float | None = None,
) -> TierSignals:
    """Signals from the current scrape and the previous one (rates need both).

    Windowed values with no new events (no drafts, no finished requests) keep the last known
    value: an idle large tier still has the acceptance rate it had a moment ago.
    """
    drafted = _delta(cur, prev, DRAFT_TOKENS)
    accepted = _delta(cur, prev, ACCEPTED_TOKENS)
    acceptance = accepted / drafted if drafted and accepted is not None else None
    generated = _delta(cur, prev, GENERATION_TOKENS)
    windowed = {
        "spec_acceptance": acceptance,
        "ttft_s": _mean_in_window(cur, prev, (TTFT,)),
        "tpot_s": _mean_in_window(cur, prev, TPOT),
        "e2e_s": _mean_in_window(cur, prev, (E2E,)),
    }
    if last is not None:
        windowed = {k: v if v is not None else getattr(last, k) for k, v in windowed.items()}
    return TierSignals(
        tier=tier,
        status="ok",
        ready=True,
        time=time.time() if now is None else now,
        running=cur.gauge(RUNNING),
        waiting=cur.gauge(WAITING),
        kv_cache_usage=cur.gauge(*KV_CACHE),
        generation_tokens_per_s=generated / elapsed_s
        if generated is not None and elapsed_s > 0
        else None,
        **windowed,
    )
