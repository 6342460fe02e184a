"""`cost-router serve` and `cost-router config check`."""

from __future__ import annotations

from pathlib import Path

import typer

from router.commands.common import fail, load_config_or_exit
from router.observability.telemetry_config import missing_packages
from router.server.ports import listen_problem

config_app = typer.Typer(no_args_is_help=True)


@config_app.command("check")
def config_check_cmd(path: Path) -> None:
    """Validate a config file; on error, name the offending key and exit 2."""
    config = load_config_or_exit(path)
    if missing := missing_packages(config.telemetry):
        extra = "'cost-router[otel]'" + (
            " opentelemetry-exporter-otlp-proto-grpc" if config.telemetry.protocol == "grpc" else ""
        )
        raise fail(
            f"{path}: telemetry.enabled: tracing needs {missing}, which is not "
            f"installed: pip install {extra}"
        )
    typer.echo(f"{path}: OK ({len(config.tiers)} tiers, {len(config.policies)} policies)")


def serve_cmd(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML config; without it, run the embedded local demo"
    ),
    host: str | None = typer.Option(None, help="override server.host"),
    port: int | None = typer.Option(
        None, help="override server.port (the demo: 0 = any free ports for proxy and tiers)"
    ),
    tier_ports: str | None = typer.Option(
        None,
        "--tier-ports",
        help="the demo only: SMALL,LARGE ports of its two llama.cpp servers (default 8101,8102)",
    ),
) -> None:
    """Run the OpenAI-compatible routing proxy (no --config: the embedded llama.cpp demo)."""
    # Imported here: the server stack (uvicorn, the FastAPI app, onnxruntime) is only needed by
    # this command, and every other command starts faster without it.
    from router.server.demo import parse_tier_ports, run_demo
    from router.server.run import run_server

    if config is None:
        try:
            ports = parse_tier_ports(tier_ports) if tier_ports is not None else None
        except ValueError as exc:
            raise fail(str(exc)) from None
        raise typer.Exit(run_demo(host=host, port=port, tier_ports=ports))
    if tier_ports is not None:
        raise fail(
            "--tier-ports is for the embedded demo (no --config): a config's tiers name "
            "their own base_url"
        )
    router_config = load_config_or_exit(config)
    # Checked before the app loads anything, so a port in use is one line, not a traceback.
    listen_host = host or router_config.server.host
    listen_port = router_config.server.port if port is None else port
    if problem := listen_problem(listen_host, listen_port):
        raise fail(
            f"{problem}: stop what listens there or choose another port with --port N, "
            f"server.port in {config} or COST_ROUTER__SERVER__PORT"
        )
    run_server(router_config, host=host, port=port, config_path=config)


def register_serve(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config", help="Validate configuration.")
    app.command("serve")(serve_cmd)
