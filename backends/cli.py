"""CLI commands of this area (registered by router/cli.py)."""

from __future__ import annotations

import typer

backends_app = typer.Typer(no_args_is_help=True)
