"""The work behind each simulator command; returns the text to print (the CLI stays thin)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from classifiers.evaluate import apgr, cpt
from router.config import RouterConfig
from simulations import reports
from simulations.replay import ReplayResult, sweep_inputs, trace_scores, two_tier_policy
from simulations.sim_config import describe_prices, write_threshold
from simulations.sweep import default_thresholds
from simulations.trace import ReplayTrace
from simulations.tune import Target, TuneResult, tune
from simulations.whatif import Levers, poisson_arrivals, spec_summary, what_if


def _ci(result: TuneResult, name: str, fmt: str) -> str:
    iv = result.intervals.get(name)
    return f"[{format(iv.low, fmt)}, {format(iv.high, fmt)}]" if iv else "(no bootstrap)"


def tune_text(result: TuneResult, policy: str, prices: str, n: int, extra: dict[str, float]) -> str:
    r = result
    rows = [
        ("threshold", f"{r.threshold:.4f}", _ci(r, "threshold", ".4f")),
        ("quality / all-large", f"{r.quality_ratio:.2%}", _ci(r, "quality_ratio", ".2%")),
        ("quality (mean outcome)", f"{r.quality:.4f}", _ci(r, "quality", ".4f")),
        ("cost per 1k requests", f"${r.cost_per_1k:.4f}", _ci(r, "cost_per_1k", ".4f")),
        ("cost / all-large", f"{r.cost_per_1k / r.sweep.cost_large_per_1k:.2%}", ""),
        ("large share", f"{r.large_share:.2%}", _ci(r, "large_share", ".2%")),
    ]
    head = (
        f"policy {policy!r}, target {r.target.describe()}, {n} requests; prices {prices}\n"
        f"all-large: quality {r.sweep.quality_large:.4f}, ${r.sweep.cost_large_per_1k:.4f}/1k; "
        f"all-small: quality {r.sweep.quality_small:.4f}, ${r.sweep.cost_small_per_1k:.4f}/1k\n"
        + ", ".join(f"{k} {v:.3f}" for k, v in extra.items())
    )
    foot = (
        f"95% intervals: Poisson bootstrap ({r.bootstrap_method}), {r.resamples} resamples "
        "(threshold: the rule re-run on "
        f"each resample; others: the chosen threshold's metrics)"
        + (f"; {r.unmet_resamples} resamples met no threshold" if r.unmet_resamples else "")
    )
    return "\n".join([head, "", reports.table(["", "chosen", "95% CI"], rows), "", foot])


def run_tune(
    config: RouterConfig,
    trace: ReplayTrace,
    target: tuple[str, float],
    policy_name: str | None,
    write: Path | None,
    grid: int,
    resamples: int,
    seed: int,
    recorded_scores: bool,
    json_out: Path | None,
    chart: Path | None,
) -> str:
    policy = two_tier_policy(config, policy_name)
    scores = trace_scores(trace, config, recorded_scores)
    inputs = sweep_inputs(config, trace, scores, policy)
    tgt = Target(target[0], float(target[1]))  # type: ignore[arg-type]
    result = tune(inputs, tgt, default_thresholds(grid), resamples, seed)
    extra = {
        "APGR": apgr(scores, inputs.quality_small, inputs.quality_large),
        "CPT(50%)": cpt(scores, inputs.quality_small, inputs.quality_large, 0.5),
        "CPT(80%)": cpt(scores, inputs.quality_small, inputs.quality_large, 0.8),
    }
    text = tune_text(result, policy.name, describe_prices(config), len(trace), extra)
    if json_out:
        reports.write_json(
            json_out,
            {
                **result.as_dict(),
                "policy": policy.name,
                **extra,
                "sweep": reports.sweep_json(result.sweep),
            },
        )
    if chart:
        chosen = int(np.argmin(np.abs(result.sweep.thresholds - result.threshold)))
        reports.pareto_chart(result.sweep, chosen, chart, f"{policy.name}: {tgt.describe()}")
    if write:
        name = write_threshold(write, policy_name, result.threshold)
        text += f"\nwrote policies.{name}.threshold = {result.threshold:.6g} to {write}"
    return text


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def replay_text(summary: dict[str, object], baselines: dict[str, float]) -> str:
    share = summary["share"]
    assert isinstance(share, dict)
    rows = [
        ("requests", summary["requests"]),
        *((f"share {t}", f"{v:.2%}") for t, v in share.items()),
        ("cost USD", f"{summary['cost_usd']:.4f}"),
        ("cost per 1k requests", f"${summary['cost_per_1k']:.4f}"),
        ("quality", "-" if summary.get("quality") is None else f"{summary['quality']:.4f}"),
        *((k, f"{v:.4f}") for k, v in baselines.items()),
    ]
    return reports.table(["", str(summary.get("policy", ""))], rows)


def budget_text(tallies: dict[str, object]) -> str:
    rows = []
    for t in tallies.values():
        d = t.as_dict()  # type: ignore[attr-defined]
        rows.append(
            (
                d["team"],
                "-" if d["limit_usd"] is None else f"{d['limit_usd']:g}",
                d["period"] or "-",
                d["requests"],
                d["large"],
                d["downgraded"],
                d["refused"],
                f"{d['spent_usd']:.4f}",
                _fmt_time(d["first_downgrade"]),
                _fmt_time(d["exhausted_at"]),
            )
        )
    return reports.table(
        [
            "team",
            "limit $",
            "period",
            "requests",
            "large",
            "downgraded",
            "refused",
            "spent $",
            "first downgrade",
            "exhausted",
        ],
        rows,
    )


def run_simulate(
    config: RouterConfig,
    trace: ReplayTrace,
    policy: str | None,
    recorded: bool,
    budgets: bool,
    pacing: tuple[float, float],
    json_out: Path | None,
    decisions: Path | None = None,
    compare: bool = False,
) -> str:
    from simulations.budget_replay import budget_replay
    from simulations.replay import TierPrices, replay, role_costs

    scores = trace_scores(trace, config, recorded)
    result = replay(config, trace, scores, policy)
    if decisions:
        write_decisions(decisions, trace, result)
    summary = result.summary()
    baselines: dict[str, float] = {}
    cost = role_costs(TierPrices.from_config(config), trace.prompt_tokens, trace.completion_tokens)
    for role, label in ((0, "all-small"), (1, "all-large")):
        baselines[f"{label} cost per 1k"] = float(cost[:, role].mean() * 1000)
        q = trace.quality[:, role]
        if not np.isnan(q).all():
            baselines[f"{label} quality"] = float(np.nanmean(q))
    out: dict[str, object] = {"summary": summary, "baselines": baselines}
    text = replay_text(summary, baselines)
    if compare:
        rows = [replay(config, trace, scores, name).summary() for name in config.policies]
        out["policies"] = rows
        text += "\n\nevery configured policy on this trace:\n" + compare_text(rows)
    if budgets:
        plain = budget_replay(config, trace, scores, policy)
        with_pacing = budget_replay(config, trace, scores, policy, pacing)
        text += "\n\nbudgets, as configured:\n" + budget_text(plain)  # type: ignore[arg-type]
        text += (
            f"\n\nbudgets with budget_pacing (max_threshold {pacing[0]:g}, slack "
            f"{pacing[1]:g}):\n" + budget_text(with_pacing)
        )  # type: ignore[arg-type]
        out["budgets"] = [t.as_dict() for t in plain.values()]
        out["budgets_paced"] = [t.as_dict() for t in with_pacing.values()]
    if json_out:
        reports.write_json(json_out, out)
    return text


def compare_text(summaries: list[dict[str, object]]) -> str:
    rows = []
    for s in summaries:
        share = s["share"]
        assert isinstance(share, dict)
        q = s.get("quality")
        rows.append(
            (
                s["policy"],
                *(f"{v:.1%}" for v in share.values()),
                f"{s['cost_per_1k']:.4f}",
                "-" if q is None else f"{q:.4f}",
            )
        )
    tiers = list(summaries[0]["share"]) if summaries else []  # type: ignore[arg-type]
    return reports.table(["policy", *tiers, "$/1k", "quality"], rows)


def write_decisions(path: Path, trace: ReplayTrace, result: ReplayResult) -> None:
    """One JSON line per request: the simulator's decision, to diff against a proxy trace."""
    import orjson

    with path.open("wb") as out:
        for i in range(len(trace)):
            q = float(result.quality[i])
            row = {
                "row": i,
                "record": trace.record(i),
                "score": float(result.scores[i]),
                "tier": result.tiers[int(result.tier_idx[i])],
                "cost_usd": float(result.cost_usd[i]),
                "quality": None if np.isnan(q) else q,
            }
            out.write(orjson.dumps(row) + b"\n")


def run_stream(
    config: RouterConfig,
    path: Path,
    policy: str | None,
    recorded: bool,
    batch_rows: int,
    json_out: Path | None,
) -> str:
    from classifiers.inference import DifficultyScorer
    from simulations.stream import stream_replay

    scorer = DifficultyScorer.load(config.classifier.model_path)
    totals = stream_replay(
        config, path, scorer.score_texts, policy, batch_rows, use_recorded=recorded
    )
    summary = totals.summary()
    if json_out:
        reports.write_json(json_out, {"summary": summary, "sweep": totals.sweep_rows()})
    teams = summary.pop("team_cost_usd")
    assert isinstance(teams, dict)
    text = replay_text(summary, {})
    top = sorted(teams.items(), key=lambda kv: -kv[1])[:10]
    return (
        text
        + "\n\nspend by team (top 10):\n"
        + reports.table(["team", "USD"], [(k, f"{v:.2f}") for k, v in top])
    )


def run_whatif(
    config: RouterConfig,
    trace: ReplayTrace,
    policy: str | None,
    recorded: bool,
    levers: Levers,
    arrival_rate: float | None,
    seed: int,
    json_out: Path | None,
    chart: Path | None,
) -> str:
    if trace.times is None and arrival_rate is not None:
        arrivals = poisson_arrivals(len(trace), arrival_rate, seed)
        source = f"Poisson arrivals at {arrival_rate:g}/s (the trace has no timestamps)"
    else:
        arrivals = trace.require_times()
        source = "the trace's arrival times"
    scores = trace_scores(trace, config, recorded)
    results = what_if(config, trace, scores, arrivals, levers, policy)
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
    text = f"{len(trace)} requests, {source}\n{spec_summary(levers)}\n\n" + reports.table(
        ["scenario", "lever", "$/1k", "quality", "large", "busiest tier load", "p50 s", "p95 s"],
        rows,
    )
    if any(r.max_utilization > 1 for r in results):
        text += (
            "\n\nOVERLOADED: a tier gets more work than its concurrency can serve (load > 1); its "
            "queue grows for as long as the trace runs. Raise --*-concurrency or lower the rate."
        )
    if json_out:
        reports.write_json(json_out, [r.row() for r in results])
    if chart:
        reports.latency_chart(
            {r.name: r.latency.e2e_s for r in results}, chart, "what-if: end-to-end latency"
        )
    return text
