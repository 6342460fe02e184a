"""`cost-router backends plan|launch|signals` (registered by router/cli.py).

vLLM is never imported here, only located with find_spec (backends/processes.py)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType

import typer

from backends.launch import LaunchError, LaunchPlan, plan_tiers
from backends.signal_endpoints import polled_endpoints
from backends.signal_snapshots import save_snapshot
from router.commands.common import fail, load_config_or_exit
from router.config import RouterConfig

backends_app = typer.Typer(no_args_is_help=True)

CONFIG_OPT = typer.Option(..., "--config", "-c", help="router YAML config with tiers[].launch")
PLAN_CONFIG_OPT = typer.Option(
    None, "--config", "-c", help="router YAML with tiers[].launch (default: the embedded demo)"
)


def _load(path: Path | None) -> RouterConfig:
    if path is None:
        # Imported here, like the process and polling modules below: they bring httpx, which
        # only these commands need (this module is imported for every `cost-router` command).
        from router.server.demo import DEMO_PORT, DEMO_TIER_PORTS, demo_config

        # The ports `cost-router serve` gives the demo (unless run with --port 0).
        return demo_config(*DEMO_TIER_PORTS, host="127.0.0.1", port=DEMO_PORT)
    return load_config_or_exit(path)


def _plans(path: Path | None, only: list[str] | None) -> list[LaunchPlan]:
    try:
        plans = plan_tiers(_load(path).tiers)
    except LaunchError as exc:
        raise fail(f"{exc}") from None
    if only:
        unknown = sorted(set(only) - {p.tier for p in plans})
        if unknown:
            raise fail(f"no launch profile for tier(s) {unknown}")
        plans = [p for p in plans if p.tier in only]
    if not plans:
        raise fail(f"{path or 'the config'}: no tier has a `launch:` profile")
    return plans


@backends_app.command("plan")
def plan_cmd(config: Path | None = PLAN_CONFIG_OPT) -> None:
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
def launch_cmd(
    config: Path | None = PLAN_CONFIG_OPT,
    tier: list[str] | None = typer.Option(None, "--tier", help="only these tiers (repeatable)"),
    log_dir: Path = typer.Option(Path("logs/backends"), help="one <tier>.log per server"),
) -> None:
    """Start each tier's server where its engine is installed, wait until all answer
    GET /v1/models, then keep them running until Ctrl-C / SIGTERM (which stops them all)."""
    plans = _plans(config, tier)
    from backends.processes import ServerGroup, engine_available

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
def signals_cmd(
    config: Path = CONFIG_OPT,
    interval: float = typer.Option(2.0, help="seconds between the two polls rates come from"),
    save: Path | None = typer.Option(None, help="write the snapshot as JSON (for simulate)"),
) -> None:
    """Poll every tier's /metrics twice and print load, acceptance rate and latency per tier."""
    from backends.signal_poller import measure_now

    router_config = _load(config)
    endpoints = polled_endpoints(router_config.tiers)
    if not endpoints:
        raise fail("no tier has a metrics_url or a launch profile to poll")
    snap = measure_now(endpoints, interval, router_config.signals.timeout_s)
    for name, s in snap.items():
        values = " ".join(f"{k}={v:.4g}" for k, v in s.numeric().items())
        typer.echo(f"{name}: {s.status} {values}" + (f" ({s.detail})" if s.detail else ""))
    if save is not None:
        save_snapshot(save, snap)
        typer.echo(f"saved {save}")
