"""`cost-router ab ...`: A/B experiment commands (registered by router/cli.py).

The statistics and charts live in simulations/ab_report.py and simulations/ab_chart.py.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import typer

from policies.config import ExperimentConfig
from policies.spec import tiers_by_price
from router.commands.common import fail, load_config_or_exit
from router.config import RouterConfig

ab_app = typer.Typer(no_args_is_help=True)


@ab_app.command("report")
def report_cmd(
    traces: list[Path] = typer.Option(
        ..., "--traces", "-t", help="trace JSONL files or directories"
    ),
    experiment: str = typer.Option(..., "--experiment", help="experiment name"),
    feedback: Path | None = typer.Option(
        None, "--feedback", help="feedback JSONL (default: feedback.jsonl next to the traces)"
    ),
    out: Path | None = typer.Option(None, "--out", help="chart file: .png or .html"),
    large_tier: str | None = typer.Option(
        None, "--large-tier", help="tier counted as large (default: highest cost per token)"
    ),
    control: str | None = typer.Option(
        None, "--control", help="arm to compare against (default: 'control' or the first)"
    ),
    json_out: Path | None = typer.Option(None, "--json", help="also write the numbers as JSON"),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="router config: arm weights (sample-ratio check), large tier"
    ),
    unit: str | None = typer.Option(
        None,
        "--unit",
        help="assignment unit for traces that do not record one (team, key, user, header, "
        "session; default: the config's), or 'request' to treat requests as independent",
    ),
) -> None:
    """Per-arm requests, share to large, cost per 1k, latency p50/p95 and feedback with 95% CIs,
    and each arm's difference from the control with a significance test. Intervals resample the
    unit that assigned the arms (recorded in the traces); what none can be computed for (fewer
    than 2 units in an arm, a unit in two arms) is refused, exit 1."""
    from simulations.ab_report import (
        ReportError,
        Unanswerable,
        format_table,
        report_from_files,
        to_dict,
    )

    if out is not None and out.suffix.lower() not in (".png", ".html", ".htm"):
        raise fail(f"--out must end in .png or .html, not {out.name!r}")
    router_config = load_config_or_exit(config) if config else None
    try:
        weights, priciest, configured = (
            _from_config(router_config, experiment, config) if router_config else (None, None, None)
        )
        rep = report_from_files(
            traces,
            experiment,
            feedback,
            large_tier=large_tier or priciest,
            control=control,
            weights=weights,
            unit=unit or configured,
        )
    except Unanswerable as exc:  # the data holds no interval to give: say why, exit 1
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except ReportError as exc:  # traces, feedback, arms or names that cannot be used
        raise fail(str(exc)) from None
    typer.echo(format_table(rep))
    if out is not None:
        from simulations.ab_chart import write_chart

        write_chart(rep, out)
        typer.echo(f"\nchart written to {out}")
    if json_out is not None:
        json_out.write_bytes(
            orjson.dumps(to_dict(rep), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        )


def _experiment(config: RouterConfig, name: str) -> ExperimentConfig | None:
    return next((e for e in config.experiments if e.name == name), None)


def _from_config(
    config: RouterConfig, experiment: str, path: Path | None
) -> tuple[dict[str, float], str, str]:
    """The experiment's arm weights, the priciest tier and the assignment unit (what the report
    resamples), from the router config."""
    from simulations.ab_report import ReportError

    exp = _experiment(config, experiment)
    if exp is None:
        raise ReportError(f"no experiment {experiment!r} in {path}")
    weights = {a: arm.weight for a, arm in exp.arms.items()}
    return weights, tiers_by_price(config.policy_env().prices)[-1], exp.unit


@ab_app.command("assign")
def assign_cmd(
    config: Path = typer.Option(..., "--config", "-c", help="router config YAML"),
    experiment: str = typer.Option(..., "--experiment"),
    units: list[str] = typer.Argument(None, help="unit values (team, key id, user or header)"),
) -> None:
    """Show which arm each unit gets (the same answer every replica gives)."""
    from policies.experiments import Experiment

    found = _experiment(load_config_or_exit(config), experiment)
    if found is None:
        raise fail(f"no experiment {experiment!r} in {config}")
    exp = Experiment(found)
    for unit in units or []:
        arm = exp.arm_for(unit)
        typer.echo(f"{unit}\t{arm}\t{exp.policy_of(arm)}")
