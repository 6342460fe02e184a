"""`what-if`'s report: cost, quality, large share, busiest tier load and p50/p95 latency of each
scenario (text table, JSON, latency chart)."""

from __future__ import annotations

from pathlib import Path

from simulations import reports
from simulations.replay import trace_scores
from simulations.session_inputs import CacheOptions, cache_model, graded_outcomes
from simulations.sessions import load_session_trace
from simulations.sim_config import SimConfig
from simulations.trace import ReplayTrace
from simulations.whatif import (
    ROUTED,
    Levers,
    poisson_arrivals,
    session_what_if,
    spec_summary,
    what_if,
)


def run_whatif(
    sim: SimConfig,
    trace: ReplayTrace,
    policy: str | None,
    recorded: bool,
    levers: Levers,
    arrival_rate: float | None,
    seed: int,
    json_out: Path | None,
    chart: Path | None,
) -> str:
    if chart is not None:
        reports.check_chart_path(chart)  # before the work, not after it
    if arrival_rate is not None and not trace.has_times():
        arrivals = poisson_arrivals(len(trace), arrival_rate, seed)
        source = f"Poisson arrivals at {arrival_rate:g}/s (the trace lacks timestamps)"
    else:
        arrivals = trace.require_times()
        source = "the trace's arrival times"
    scores = trace_scores(trace, sim.model_path, recorded)
    results = what_if(sim, trace, scores, arrivals, levers, policy)
    rows = []
    for r in results:
        p = r.latency.percentiles()
        rows.append(
            (
                r.name,
                r.lever,
                f"{r.cost_per_1k:.4f}",
                f"{r.quality:.4f}",
                f"{r.large_share:.1%}",
                f"{r.max_utilization:.2f}" + (" OVERLOADED" if r.max_utilization > 1 else ""),
                f"{p['p50_s']:.3f}",
                f"{p['p95_s']:.3f}",
            )
        )
    headers = [
        "scenario",
        "lever",
        "$/1k",
        "quality",
        "large",
        "busiest tier load",
        "p50 s",
        "p95 s",
    ]
    notes = [f"{len(trace)} requests, {source}", spec_summary(levers)]
    if any(r.max_utilization > 1 for r in results):
        notes.append(
            "OVERLOADED: a tier gets more work than its concurrency can serve (load > 1); its "
            "queue grows for as long as the trace runs. Raise --*-concurrency or lower the rate."
        )
    text = "\n".join(notes[:2]) + "\n\n" + reports.table(headers, rows)
    if len(notes) > 2:
        text += "\n\n" + notes[2]
    if json_out:
        reports.write_json(json_out, [r.row() for r in results])
    if chart:
        reports.latency_chart(
            {r.name: r.latency.e2e_s for r in results},
            chart,
            "what-if: end-to-end latency per scenario",
            reference=ROUTED if any(r.name == ROUTED for r in results) else None,
            tables=[reports.HtmlTable("scenarios", headers, rows)],
            notes=notes,
        )
    return text


def _pct(v: object) -> str:
    return "-" if v is None else f"{float(v):.1%}"  # type: ignore[arg-type]


def run_whatif_sessions(
    sim: SimConfig,
    traces: list[Path],
    policy: str | None,
    levers: Levers,
    options: CacheOptions,
    json_out: Path | None,
) -> str:
    """`what-if --sessions`: each session mode's cost with caching, switches per session,
    quality and latency on the same conversations (simulations/whatif.py session_what_if)."""
    trace = load_session_trace(traces)
    rows = session_what_if(
        sim, trace, cache_model(trace, options), levers, graded_outcomes(traces), policy
    )
    headers = [
        "mode",
        "switches/session",
        "sessions switched",
        "large",
        "cached prompt",
        "$/1k",
        "of all-large",
        "quality",
        "p50 s",
        "p95 s",
    ]
    body = [
        (
            r["mode"],
            f"{float(r['switches_per_session']):.3f}",  # type: ignore[arg-type]
            _pct(r["sessions_switched"]),
            _pct(r["large_share"]),
            _pct(r["cached_share"]),
            f"{float(r['cost_per_1k']):.4f}",  # type: ignore[arg-type]
            _pct(r["share_of_all_large"]),
            "-" if r["quality"] is None else f"{float(r['quality']):.4f}",  # type: ignore[arg-type]
            f"{float(r['p50_s']):.3f}",  # type: ignore[arg-type]
            f"{float(r['p95_s']):.3f}",  # type: ignore[arg-type]
        )
        for r in rows
    ]
    graded = int(rows[0]["graded"])  # type: ignore[call-overload]
    notes = [
        f"{len(trace)} requests in {int(rows[0]['sessions'])} sessions at the trace's arrival "  # type: ignore[call-overload]
        f"times; each session mode replayed conversation by conversation with a prompt cache "
        f"per tier ({options.ttl_s:g} s, blocks of {options.block}); $/1k with caching",
        f"quality: mean outcome on the {graded} requests graded on both tiers"
        if graded
        else "quality: no request is graded on both tiers (labels beside the traces, e.g. "
        "`cost-router grades import`)",
        "latency: the tiers' latency as given (no quantization or speculative decoding)",
    ]
    if json_out:
        reports.write_json(json_out, {"modes": rows})
    return "\n".join(notes) + "\n\n" + reports.table(headers, body)
