"""`cost-router backends plan|launch|signals` (registered by router/cli.py).

Heavy imports stay inside commands; vLLM is never imported, only located with find_spec."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from backends.launch import LaunchPlan
    from router.config import RouterConfig

backends_app = typer.Typer(no_args_is_help=True)

CONFIG_OPT = typer.Option(..., "--config", "-c", help="router YAML config with tiers[].launch")
PLAN_CONFIG_OPT = typer.Option(
    None, "--config", "-c", help="router YAML with tiers[].launch (default: the embedded demo)"
)
# Fixed ports for the demo's plan: `cost-router serve` picks free ones when it runs the demo.
DEMO_PORTS = (8101, 8102)


def _load(path: Path | None) -> RouterConfig:
    from router.config import ConfigError, load_config

    if path is None:
        from router.demo import demo_config

        return demo_config(*DEMO_PORTS, host="127.0.0.1", port=8080)
    try:
        return load_config(path)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


def _plans(path: Path | None, only: list[str] | None) -> list[LaunchPlan]:
    from backends.launch import LaunchError, plan_config

    config = _load(path)
    try:
        plans = plan_config(config)
    except LaunchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if only:
        unknown = sorted(set(only) - {p.tier for p in plans})
        if unknown:
            typer.echo(f"error: no launch profile for tier(s) {unknown}", err=True)
            raise typer.Exit(1)
        plans = [p for p in plans if p.tier in only]
    if not plans:
        typer.echo(f"error: {path or 'the config'}: no tier has a `launch:` profile", err=True)
        raise typer.Exit(1)
    return plans


@backends_app.command("plan")
def plan(config: Path | None = PLAN_CONFIG_OPT) -> None:
    """Print the server command line of every tier with a launch profile (runs nothing)."""
    for p in _plans(config, None):
        metrics = p.metrics_url or "none (readiness from /v1/models only)"
        typer.echo(f"# tier {p.tier} ({p.engine}): serves {p.base_url}, metrics {metrics}")
        typer.echo(p.shell())
        for warning in p.warnings:
            typer.echo(f"warning: {warning}", err=True)


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Turns `kill PID` into the same orderly exit as Ctrl-C, so children are stopped.
    raise KeyboardInterrupt


@backends_app.command("launch")
def launch(
    config: Path | None = PLAN_CONFIG_OPT,
    tier: list[str] | None = typer.Option(None, "--tier", help="only these tiers (repeatable)"),
    log_dir: Path = typer.Option(Path("logs/backends"), help="one <tier>.log per server"),
) -> None:
    """Start each tier's server where its engine is installed, wait until all answer
    GET /v1/models, then keep them running until Ctrl-C / SIGTERM (which stops them all)."""
    import time

    from backends.launch import LaunchError
    from backends.processes import ServerGroup, engine_available

    plans = _plans(config, tier)
    missing = [(p.tier, why) for p in plans for ok, why in [engine_available(p.engine)] if not ok]
    if missing:
        for name, why in missing:
            typer.echo(f"error: tier {name!r} cannot start here: {why}", err=True)
        typer.echo("(`cost-router backends plan` prints the commands to run elsewhere)", err=True)
        raise typer.Exit(1)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        with ServerGroup(plans, log_dir) as group:
            group.wait_ready()
            for p in plans:
                typer.echo(f"ready: tier {p.tier} at {p.base_url} (log {group.log_path(p.tier)})")
            while True:
                time.sleep(1.0)
    except LaunchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("stopped all tier servers")


@backends_app.command("signals")
def signals(
    config: Path = CONFIG_OPT,
    interval: float = typer.Option(2.0, help="seconds between the two polls rates come from"),
    save: Path | None = typer.Option(None, help="write the snapshot as JSON (for simulate)"),
) -> None:
    """Poll every tier's /metrics twice and print load, acceptance rate and latency per tier."""
    from backends.signals import endpoints_from_config, measure_now, save_snapshot

    cfg = _load(config)
    endpoints = endpoints_from_config(cfg)
    if not endpoints:
        typer.echo("error: no tier has a metrics_url or a launch profile to poll", err=True)
        raise typer.Exit(1)
    snap = measure_now(endpoints, interval, cfg.signals.timeout_s)
    for name, s in snap.items():
        values = " ".join(f"{k}={v:.4g}" for k, v in s.numeric().items())
        typer.echo(f"{name}: {s.status} {values}" + (f" ({s.detail})" if s.detail else ""))
    if save is not None:
        save_snapshot(save, snap)
        typer.echo(f"saved {save}")
