"""`tune`'s report: the threshold chosen for a target with its bootstrap intervals (text table and
JSON), the routing quality of the scores (APGR, CPT), and the Pareto chart of the sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from classifiers.evaluate import apgr, cpt
from simulations import reports
from simulations.replay import policy_model_path, sweep_inputs, trace_scores, two_tier_policy
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
    inputs = sweep_inputs(sim.prices, trace, scores, policy)
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
