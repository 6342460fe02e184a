"""`cost-router drift report|reference` (registered by router/cli.py).

`drift report` streams a JSONL trace folder or a date-partitioned Parquet dataset into per-window
drift figures (simulations/drift_report.py), prints a table, writes drift.png / drift.html /
drift.json with --out, and exits 1 when a window is flagged (for cron and CI), 2 on bad input.
`drift reference` writes the reference score distribution (classifiers/score_reference.py), by
default beside the model as `<model>.scores.json`. Heavy imports (scipy, pyarrow, matplotlib)
stay inside the commands so the root CLI starts fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from classifiers.score_reference import (
    ScoreReference,
    ScoreReferenceError,
)
from policies.config import PolicyConfig
from policies.spec import tiers_by_price
from router.commands.common import fail, load_config_or_exit
from router.config import RouterConfig
from simulations.drift_basis import (
    configured_target,
    policy_model,
    reference_file,
    reference_from_traces,
    threshold_and_target,
)

drift_app = typer.Typer(no_args_is_help=True)

TRACES = typer.Option(
    ...,
    "--traces",
    "-t",
    help="JSONL trace folder/file, or Parquet dataset (folder, file or URI such as s3://...)",
)
CONFIG = typer.Option(None, "--config", "-c", help="router YAML: policy threshold, target, tiers")
POLICY = typer.Option(None, "--policy", "-p", help="policy name (default: the config's default)")


def _policy(
    config: RouterConfig | None, policy: str | None
) -> tuple[str | None, PolicyConfig | None]:
    """The policy `--policy` names (default: the config's default), with its config entry."""
    if config is None:
        return policy, None
    name = policy or config.default_policy
    entry = config.policies.get(name)
    if entry is None:
        raise fail(
            f"--policy: no policy {name!r} in the config "
            f"(policies: {', '.join(sorted(config.policies)) or 'none'})"
        )
    return name, entry


def _classifier_model(config: RouterConfig | None) -> str | None:
    return config.classifier.model_path if config is not None else None


def _tiers(
    config: RouterConfig | None,
    params: dict[str, Any],
    threshold: float | None,
    policy: str | None,
) -> Any:
    from simulations.drift_sources import Tiers

    if config is None:
        return Tiers("small", "large", threshold, None, policy)
    prices = config.policy_env().prices
    order = tiers_by_price(prices)
    small, large = params.get("small") or order[0], params.get("large") or order[-1]
    return Tiers(small, large, threshold, (prices[small], prices[large]), policy)


@drift_app.command("report")
def report_cmd(
    traces: str = TRACES,
    reference: Path | None = typer.Option(
        None,
        "--reference",
        "-r",
        help="reference scores (.scores.json; default: the config's monitoring.reference, else "
        "<model>.scores.json, else the first window)",
    ),
    window: str = typer.Option("1h", "--window", "-w", help="window length: 1h or 1d"),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="folder for drift.png, drift.html and drift.json"
    ),
    config: Path | None = CONFIG,
    policy: str | None = POLICY,
    threshold: float | None = typer.Option(
        None,
        "--threshold",
        min=0,
        max=1,
        help="threshold in force (default: the policy's, or its target share's on the "
        "reference); decides the tier where the data records none",
    ),
    target: float | None = typer.Option(
        None,
        "--target",
        min=0,
        max=1,
        help="target large share (default: the policy's target_large_share, else the "
        "reference's share at the threshold)",
    ),
    # The limits' defaults: the config's monitoring.drift (simulations/drift_limits.py).
    psi_limit: float | None = typer.Option(None, "--psi-limit", help="default 0.2"),
    quality_limit: float | None = typer.Option(None, "--quality-limit", help="default 0.9"),
    min_labels: int | None = typer.Option(None, "--min-labels", help="default 30"),
    false_alarms: float | None = typer.Option(
        None, "--false-alarms-per-30d", help="false-alarm budget (default 1)"
    ),
    requests_per_hour: float | None = typer.Option(
        None, "--requests-per-hour", help="traffic the share CUSUM is planned for (default 1000)"
    ),
) -> None:
    """Per-window score drift (PSI, KS p), large share against target, quality retained with its
    95% interval and label count, cost per 1k; flagged windows with the reason, the threshold that
    restores the target, whether retraining is advised. Exit 1 when a window is flagged."""
    from rich.console import Console
    from rich.table import Table

    from simulations.drift_chart import HEADERS, notes, row_cells, write_outputs
    from simulations.drift_limits import DriftLimits
    from simulations.drift_report import WINDOWS, build_report
    from simulations.drift_sources import DriftInputError, iter_source

    if window not in WINDOWS:
        raise fail(f"--window must be one of {', '.join(WINDOWS)}, got {window!r}")
    router_config = load_config_or_exit(config) if config else None
    name, entry = _policy(router_config, policy)
    params = (entry.model_extra or {}) if entry is not None else {}
    named = reference or (router_config.monitoring.reference if router_config else None)
    try:
        ref = reference_file(named, entry, _classifier_model(router_config)).load()
    except ScoreReferenceError as exc:
        raise fail(str(exc)) from None
    used, goal = threshold_and_target(
        ref,
        threshold if threshold is not None else params.get("threshold"),
        target if target is not None else configured_target(entry),
    )
    flags = {
        "psi_limit": ("--psi-limit", psi_limit),
        "quality_limit": ("--quality-limit", quality_limit),
        "min_labels": ("--min-labels", min_labels),
        "false_alarms_per_30_days": ("--false-alarms-per-30d", false_alarms),
        "requests_per_hour": ("--requests-per-hour", requests_per_hour),
    }
    try:
        base = router_config.monitoring.drift.model_dump() if router_config is not None else {}
        limits = DriftLimits(**{**base, **{k: v for k, (_, v) in flags.items() if v is not None}})
    except ValidationError as exc:
        err = exc.errors()[0]
        flag = flags.get(str(err["loc"][0]), (str(err["loc"][0]), None))[0]
        raise fail(f"{flag}: {err['msg']}") from None
    try:
        result = build_report(
            iter_source(traces, _tiers(router_config, params, used, name)),
            window,
            ref,
            used,
            goal,
            limits,
        )
    except (DriftInputError, ValueError) as exc:
        raise fail(str(exc)) from None
    if not result.windows:
        raise fail(f"{traces}: no requests to report on")
    console = Console(width=160)
    table = Table(title=f"drift per {window} window", show_lines=False)
    for h in HEADERS:
        table.add_column(h, justify="left" if h.startswith("window") else "right")
    for w in result.windows:
        table.add_row(*row_cells(result, w), style="bold red" if w.flags else None)
    console.print(table)
    for line in notes(result):
        console.print(line, highlight=False, markup=False)
    if out is not None:
        for path in write_outputs(result, out):
            console.print(f"wrote {path}", highlight=False, markup=False)
    if result.alert:
        raise typer.Exit(1)


@drift_app.command("reference")
def reference_cmd(
    traces: str | None = typer.Option(
        None, "--traces", "-t", help="JSONL trace folder or Parquet dataset with recorded scores"
    ),
    oof: Path | None = typer.Option(
        None, "--oof", help="out-of-fold scores (`classifier train`'s <model>.oof.jsonl)"
    ),
    data: Path | None = typer.Option(
        None,
        "--data",
        help="prompts to score with the model: RouteLLM CSVs or traces with prompts (e.g. the "
        "data a threshold was tuned on)",
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="reference file (default: <model>.scores.json beside the model)"
    ),
    config: Path | None = CONFIG,
    policy: str | None = POLICY,
) -> None:
    """Write the reference score distribution that live drift gauges and `drift report`
    compare with: a trace's recorded scores, a model's out-of-fold scores, or the model's scores
    of a data set's prompts."""
    import numpy as np

    from classifiers.dataset import DatasetError, load_dataset
    from classifiers.inference import DifficultyScorer, ModelLoadError
    from classifiers.oof import read_scores
    from simulations.drift_sources import DriftInputError

    if sum(x is not None for x in (traces, oof, data)) != 1:
        raise fail("give exactly one of --traces, --oof and --data")
    router_config = load_config_or_exit(config) if config else None
    _, entry = _policy(router_config, policy)
    model = policy_model(entry, _classifier_model(router_config))
    target = out or model.scores
    try:
        if oof is not None:
            scores = np.fromiter(read_scores(oof).values(), dtype=np.float64)
            ref = ScoreReference.from_scores(scores, source=str(oof), model=model.onnx.name)
        elif data is not None:
            prompts = load_dataset(data, require_outcomes=False).prompts
            scores = DifficultyScorer.load(model.onnx).score_texts(prompts)
            ref = ScoreReference.from_scores(scores, source=str(data), model=model.onnx.name)
        else:
            assert traces is not None
            ref = reference_from_traces(traces, model=model.onnx.name)
    except (DatasetError, DriftInputError, ModelLoadError, ScoreReferenceError, ValueError) as exc:
        raise fail(str(exc)) from None
    ref.save(target)
    typer.echo(f"wrote {target}: {ref.n} scores in {ref.bins} bins from {ref.source}")
