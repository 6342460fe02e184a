"""`cost-router keys ...` and `cost-router budget ...` (registered by router/cli.py)."""

from __future__ import annotations

import typer

keys_app = typer.Typer(no_args_is_help=True)
budget_app = typer.Typer(no_args_is_help=True)
