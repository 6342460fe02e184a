"""`what-if`'s report: cost, quality, large share, busiest tier load and p50/p95 latency of each
scenario (text table, JSON, latency chart)."""

from __future__ import annotations

from pathlib import Path

from simulations import reports
from simulations.replay import trace_scores
from simulations.sim_config import SimConfig
from simulations.trace import ReplayTrace
from simulations.whatif import ROUTED, Levers, poisson_arrivals, spec_summary, what_if


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
