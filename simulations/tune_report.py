"""`tune`'s report: the threshold chosen for a target with its bootstrap intervals (text table and
JSON), the routing quality of the scores (APGR, CPT), and the Pareto chart of the sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from classifiers.evaluate import apgr, cpt
from simulations import reports
from simulations.replay import policy_model_path, sweep_inputs, trace_scores, two_tier_policy
from simulations.session_inputs import CacheOptions, cache_model, graded_outcomes
from simulations.session_tune import SessionTune, tune_sessions
from simulations.sessions import load_session_trace
from simulations.sim_config import SimConfig, describe_prices
from simulations.sweep import default_thresholds
from simulations.trace import ReplayTrace
from simulations.tune import Target, TuneResult, tune


def _ci(result: TuneResult, name: str, fmt: str) -> str:
    iv = result.intervals.get(name)
    return f"[{format(iv.low, fmt)}, {format(iv.high, fmt)}]" if iv else "(no bootstrap)"


def tune_parts(
    result: TuneResult, policy: str, prices: str, n: int, extra: dict[str, float]
) -> tuple[list[str], list[tuple[str, str, str]], str]:
    """The report's heading lines, its table rows (metric, chosen, 95% CI) and its footnote: what
    the text report prints and the HTML report shows."""
    r = result
    rows = [
        ("threshold", f"{r.threshold:.4f}", _ci(r, "threshold", ".4f")),
        ("quality / all-large", f"{r.quality_ratio:.2%}", _ci(r, "quality_ratio", ".2%")),
        ("quality (mean outcome)", f"{r.quality:.4f}", _ci(r, "quality", ".4f")),
        ("cost per 1k requests", f"${r.cost_per_1k:.4f}", _ci(r, "cost_per_1k", ".4f")),
        ("cost / all-large", f"{r.cost_per_1k / r.sweep.cost_large_per_1k:.2%}", ""),
        ("large share", f"{r.large_share:.2%}", _ci(r, "large_share", ".2%")),
    ]
    head = [
        f"policy {policy!r}, target {r.target.describe()}, {n} requests; prices {prices}",
        f"all-large: quality {r.sweep.quality_large:.4f}, ${r.sweep.cost_large_per_1k:.4f}/1k; "
        f"all-small: quality {r.sweep.quality_small:.4f}, ${r.sweep.cost_small_per_1k:.4f}/1k",
        ", ".join(f"{k} {v:.3f}" for k, v in extra.items()),
    ]
    if r.labels_note is not None:
        head.append(f"note: {r.labels_note}")
    foot = (
        f"95% intervals: Poisson bootstrap ({r.bootstrap_method}), {r.resamples} resamples "
        "(threshold: the rule re-run on "
        f"each resample; others: the chosen threshold's metrics)"
        + (f"; {r.unmet_resamples} resamples met no threshold" if r.unmet_resamples else "")
    )
    return head, rows, foot


TABLE_HEADERS = ["", "chosen", "95% CI"]


def tune_text(head: list[str], rows: list[tuple[str, str, str]], foot: str) -> str:
    return "\n".join(["\n".join(head), "", reports.table(TABLE_HEADERS, rows), "", foot])


def run_tune(
    sim: SimConfig,
    trace: ReplayTrace,
    target: tuple[str, float],
    policy_name: str | None,
    grid: int,
    resamples: int,
    seed: int,
    recorded_scores: bool,
    json_out: Path | None,
    chart: Path | None,
) -> tuple[str, TuneResult]:
    """The report's text and the result (whose threshold the command may write to a config)."""
    if chart is not None:
        reports.check_chart_path(chart)  # before the work, not after it
    policy = two_tier_policy(sim, policy_name)
    # A policy with its own model (a canary) is tuned on that model's scores, as it routes.
    scores = trace_scores(trace, policy_model_path(sim, policy.name), recorded_scores)
    inputs = sweep_inputs(sim.prices, trace, scores, policy, sim.context_windows)
    tgt = Target(target[0], float(target[1]))  # type: ignore[arg-type]
    result = tune(inputs, tgt, default_thresholds(grid), resamples, seed)
    extra = {
        "APGR": apgr(scores, inputs.quality_small, inputs.quality_large),
        "CPT(50%)": cpt(scores, inputs.quality_small, inputs.quality_large, 0.5),
        "CPT(80%)": cpt(scores, inputs.quality_small, inputs.quality_large, 0.8),
    }
    head, rows, foot = tune_parts(
        result, policy.name, describe_prices(sim.prices), len(trace), extra
    )
    text = tune_text(head, rows, foot)
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
        reports.pareto_chart(
            result.sweep,
            chosen,
            chart,
            f"{policy.name}: {tgt.describe()}",
            tables=[reports.HtmlTable("the chosen threshold", TABLE_HEADERS, rows)],
            notes=[*head, foot],
        )
    return text, result


def _opt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.2%}"


def tune_sessions_text(result: SessionTune, sim: SimConfig, options: CacheOptions) -> str:
    r = result
    graded = (
        f"quality on the {r.graded} requests graded on both tiers"
        if r.graded
        else "no request graded on both tiers: no quality"
    )
    head = [
        f"policy {r.policy!r}, target {r.target.describe()}, {r.requests} requests in "
        f"{r.sessions} sessions; prices {describe_prices(sim.prices)}",
        f"each session mode replayed conversation by conversation with a prompt cache per tier "
        f"({options.ttl_s:g} s, blocks of {options.block}); cost with caching; {graded}",
        f"all-large: ${r.all_large_cost_per_1k:.4f}/1k"
        + ("" if r.all_large_quality is None else f", quality {r.all_large_quality:.4f}"),
    ]
    rows = [
        (
            ("* " if m.configured else "  ") + m.mode,
            "-" if m.threshold is None else f"{m.threshold:.4f}",
            f"{m.large_share:.2%}",
            f"${m.cost_per_1k:.4f}",
            f"{m.cost_per_1k / r.all_large_cost_per_1k:.2%}" if r.all_large_cost_per_1k else "-",
            f"{m.switches_per_session:.3f}",
            _opt_pct(m.quality_ratio),
            m.best or "",
        )
        for m in r.modes
    ]
    headers = [
        "mode",
        "threshold",
        "large share",
        "cost/1k",
        "of all-large",
        "switches/session",
        "quality/all-large",
        "unmet",
    ]
    mine = r.configured()
    foot = (
        f"* the policy's session mode ({mine.mode}): "
        + (
            f"threshold {mine.threshold:.4f}"
            if mine.threshold is not None
            else f"no threshold meets the target ({mine.best})"
        )
        + "; no bootstrap intervals for session replays (tune without --sessions gives them)"
    )
    return "\n".join(["\n".join(head), "", reports.table(headers, rows), "", foot])


def run_tune_sessions(
    sim: SimConfig,
    traces: list[Path],
    target: tuple[str, float],
    policy_name: str | None,
    options: CacheOptions,
    json_out: Path | None,
) -> tuple[str, SessionTune]:
    """`tune --sessions`: the threshold per session mode (simulations/session_tune.py)."""
    trace = load_session_trace(traces)
    tgt = Target(target[0], float(target[1]))  # type: ignore[arg-type]
    result = tune_sessions(
        sim, trace, cache_model(trace, options), tgt, graded_outcomes(traces), policy_name
    )
    if json_out:
        reports.write_json(
            json_out,
            {
                "target": {"kind": tgt.kind, "value": tgt.value},
                "policy": result.policy,
                "requests": result.requests,
                "sessions": result.sessions,
                "graded": result.graded,
                "all_large": {
                    "quality": result.all_large_quality,
                    "cost_per_1k": result.all_large_cost_per_1k,
                },
                "modes": [m.as_dict() for m in result.modes],
            },
        )
    return tune_sessions_text(result, sim, options), result
