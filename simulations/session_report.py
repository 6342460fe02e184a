"""`simulate --sessions`'s report: each session mode side by side on one trace, priced with a
prompt cache per tier (simulations/sessions.py). Returns the text the command prints."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from simulations import reports
from simulations.session_inputs import CacheOptions, cache_model
from simulations.sessions import DEFAULT_CACHE_TTL_S, compare_modes, load_session_trace
from simulations.sim_config import SimConfig


def _pct(v: object) -> str:
    return "-" if v is None else f"{float(v):.1%}"  # type: ignore[arg-type]


def sessions_text(rows: Sequence[dict[str, object]]) -> str:
    headers = [
        "mode",
        "requests",
        "sessions",
        "switches/session",
        "sessions switched",
        "large share",
        "cached prompt",
        "cost $",
        "without cache $",
        "of all-large",
    ]
    body = [
        (
            r["mode"],
            r["requests"],
            r["sessions"],
            f"{float(r['switches_per_session']):.3f}",  # type: ignore[arg-type]
            _pct(r["sessions_switched"]),
            _pct(r["large_share"]),
            _pct(r["cached_share"]),
            f"{float(r['cost_usd']):.6f}",  # type: ignore[arg-type]
            f"{float(r['cost_without_cache_usd']):.6f}",  # type: ignore[arg-type]
            _pct(r["share_of_all_large"]),
        )
        for r in rows
    ]
    return reports.table(headers, body)


def run_sessions(
    sim: SimConfig,
    traces: Sequence[str | Path],
    policy: str | None,
    cache_ttl_s: float = DEFAULT_CACHE_TTL_S,
    hit_rate: float | None = None,
    json_out: Path | None = None,
    cache_block: int = 1,
    equal_share: float | None = None,
) -> str:
    """`hit_rate` None: each tier's measured from the trace's `cached_tokens` (the default
    where it cannot be); a number: that rate for every tier. `cache_block`: the providers
    cache whole blocks of this many tokens. `equal_share`: each mode at the threshold that
    gives it this share of large requests."""
    trace = load_session_trace(traces)
    cache = cache_model(trace, CacheOptions(cache_ttl_s, hit_rate, cache_block))
    rows = compare_modes(sim, trace, cache, policy, target_share=equal_share)
    rates = ", ".join(
        f"{t} {cache.hits(t):.3f} (+{cache.shared_tokens.get(t, 0)} shared)" for t in sim.prices
    )
    recorded = rows[-1].get("recorded_cost_usd")
    assert recorded is None or isinstance(recorded, float)
    lines = [sessions_text(rows), ""]
    if equal_share is not None:
        tuned = ", ".join(
            f"{r['mode']} {float(r['threshold']):.4f}"  # type: ignore[arg-type]
            for r in rows
            if "threshold" in r
        )
        lines.append(f"at an equal large share of {equal_share:.1%}: thresholds {tuned}")
    lines += [
        f"prompt cache: {cache_ttl_s:g} s per tier, blocks of {cache_block} tokens; hit rate of "
        f"a cacheable prefix: {rates} "
        + ("(measured from the trace's cached_tokens)" if hit_rate is None else "(given)"),
        "trace: the requests as they were served, re-priced by the cache model"
        + ("" if recorded is None else f"; the proxy charged ${recorded:.6f}"),
    ]
    if json_out:
        cache_json = {
            "ttl_s": cache_ttl_s,
            "block": cache_block,
            "hit_rate": {t: cache.hits(t) for t in sim.prices},
            "shared_tokens": dict(cache.shared_tokens),
        }
        reports.write_json(json_out, {"modes": rows, "cache": cache_json})
    return "\n".join(lines)
