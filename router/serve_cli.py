"""`cost-router serve` and `cost-router config check`."""

from __future__ import annotations

from pathlib import Path

import typer

config_app = typer.Typer(no_args_is_help=True)


@config_app.command("check")
def config_check(path: Path) -> None:
    """Validate a config file; on error, name the offending key and exit 1."""
    from router.config import ConfigError, load_config

    try:
        cfg = load_config(path)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{path}: OK ({len(cfg.tiers)} tiers, {len(cfg.policies)} policies)")


def serve(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML config; without it, run the embedded local demo"
    ),
    host: str | None = typer.Option(None, help="override server.host"),
    port: int | None = typer.Option(None, help="override server.port"),
) -> None:
    """Run the OpenAI-compatible routing proxy (no --config: the embedded llama.cpp demo)."""
    from router.config import ConfigError, load_config

    if config is None:
        from router.demo import run_demo

        raise typer.Exit(run_demo(host=host, port=port))
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    from router.server import run_server

    run_server(cfg, host=host, port=port, config_path=config)


def register_serve(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config", help="Validate configuration.")
    app.command("serve")(serve)
